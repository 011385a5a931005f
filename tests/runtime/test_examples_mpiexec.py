"""The examples/ scripts end to end under mpiexec (bounded), the plug-in path of pgc-train and
pgc-sim, and what a user script and the command line have in common: the same trajectory, the
same one-line errors, the same stop and resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import events_of, mpi_env, run_mpi, run_train, start_mpi, steps_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NETS = EXAMPLES / "nets.py"


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.mark.parametrize("example,scheme,metric", [
    ("custom_cnn.py", "pgc-cr", "test_accuracy"),
    ("dataset_transform.py", "gc-cr", "test_accuracy"),
    ("regression_metric.py", "pgc-fr", "test_r2"),
])
def test_each_example_trains_under_mpiexec(tmp_path, example, scheme, metric):
    out = tmp_path / "run"
    proc = run_mpi(5, [str(EXAMPLES / example), "--steps", "40", "--eval-every", "20", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = events_of(out, "summary")[0]
    assert summary["status"] == "completed" and summary["steps"] == 40
    evals = events_of(out, "eval")
    assert [e["step"] for e in evals] == [19, 39] and all(metric in e for e in evals)
    assert evals[-1]["train_loss"] < evals[0]["train_loss"] * 1.5  # trained, not diverged
    assert f"pgc_mpi.fit: {scheme} (n=4" in proc.stdout  # the scheme the example chose, on 4 workers; fit names itself


@pytest.mark.parametrize("example,flags,ranks", [
    ("dataset_transform.py", ["--scheme", "ddp"], 4),  # the peer baseline: torch DDP among the workers
    ("custom_cnn.py", ["--servers", "2", "--wire-dtype", "bfloat16"], 5),  # a sharded master, narrow messages
])
def test_fit_takes_every_pgc_train_option(tmp_path, example, flags, ranks):
    out = tmp_path / "run"
    proc = run_mpi(ranks, [str(EXAMPLES / example), "--steps", "12", "--eval-every", "6", *flags, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = events_of(out, "summary")[0]
    assert summary["status"] == "completed" and summary["steps"] == 12
    config = json.loads((out / "config.json").read_text())["config"]
    assert all(str(config[flag[2:].replace("-", "_")]) == value for flag, value in zip(flags[::2], flags[1::2]))
    # fit returned on rank 0 (the example prints its result) and the job ended without an abort
    assert f"outputs in {out}" in proc.stdout and "MPI_Abort" not in proc.stderr, proc.stderr[-3000:]


def test_an_example_stops_on_sigint_with_a_checkpoint_and_resumes_to_the_end(tmp_path):
    out = tmp_path / "run"
    args = [str(EXAMPLES / "custom_cnn.py"), "--steps", "200", "--checkpoint-every", "20", "--compute-time", "0.01",
            "--out", str(out)]
    proc = start_mpi(5, args, out)
    proc.send_signal(signal.SIGINT)  # mpiexec forwards it to every rank: Ctrl-C
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr[-3000:]
    stopped = events_of(out, "summary")[-1]
    assert stopped["status"] == "stopped by SIGINT" and stopped["steps"] < 200
    assert list((out / "checkpoints").glob("ckpt-*.h5"))
    proc = run_mpi(5, [*args, "--resume", "auto"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stderr
    steps = [r["step"] for r in steps_of(out)]
    assert steps == list(range(200))  # every step exactly once, across both starts
    assert events_of(out, "summary")[-1]["status"] == "completed"


def _fit_script(tmp_path: Path) -> Path:
    """A user script training examples/nets.py's model, loss and data with pgc_mpi.fit."""
    script = tmp_path / "train_nets.py"
    script.write_text(f"""import sys
sys.path.insert(0, {str(EXAMPLES)!r})
import nets
import pgc_mpi

train, test = nets.digits()
pgc_mpi.fit(nets.make_model, train, loss=nets.focal_loss, test_data=test, **pgc_mpi.options_from_args())
""")
    return script


def test_the_script_and_the_command_line_train_the_same_trajectory(tmp_path):
    """float64 dgd: pgc_mpi.fit with the objects and pgc-train with --model/--loss/--dataset
    PATH:NAME build the same model, data and partitions: the same parameters at every step."""
    flags = ["--scheme", "dgd", "--dtype", "float64", "--steps", "15", "--seed", "4", "--record-params",
             "--eval-every", "100"]
    script = run_mpi(4, [str(_fit_script(tmp_path)), *flags, "--out", str(tmp_path / "script")])
    assert script.returncode == 0, script.stderr[-3000:]
    cli = run_train(4, [*flags, "--model", f"{NETS}:make_model", "--loss", f"{NETS}:focal_loss", "--dataset",
                        f"{NETS}:digits", "--out", str(tmp_path / "cli")])
    assert cli.returncode == 0, cli.stderr[-3000:]
    a, b = np.load(tmp_path / "script" / "params.npy"), np.load(tmp_path / "cli" / "params.npy")
    assert a.shape == b.shape == (16, 2730) and np.abs(a - b).max() < 1e-12
    assert np.abs(a[-1] - a[0]).max() > 1e-3


@pytest.mark.parametrize("args,message", [  # the other bad plug-ins: tests/learning/test_plugins.py
    (["--model", f"{NETS}:nope"], "has no attribute 'nope'"),
    (["--model", f"{NETS}:digits"], "returned tuple, not a torch.nn.Module"),
])
def test_a_bad_plugin_is_one_line_and_exit_2_before_training(tmp_path, args, message):
    proc = run_train(3, [*args, "--out", str(tmp_path / "run")])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(_errors(proc.stderr)) == 1 and message in _errors(proc.stderr)[0], proc.stderr[-2000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_bad_fit_option_is_pgc_trains_one_line_error(tmp_path):
    proc = run_mpi(3, [str(_fit_script(tmp_path)), "--lr", "-1", "--out", str(tmp_path / "run")])
    assert proc.returncode == 2
    assert _errors(proc.stderr) == ["pgc_mpi.fit: error: --lr must be a number > 0, got -1.0"], proc.stderr[-2000:]


def test_ranks_that_build_different_models_are_refused(tmp_path):
    script = tmp_path / "rank_dependent.py"
    script.write_text("""import numpy as np
from mpi4py import MPI
from torch import nn
import pgc_mpi

width = 8 + MPI.COMM_WORLD.Get_rank()  # a factory that depends on the rank: a bug
x, y = np.random.default_rng(0).normal(size=(90, 4)).astype("float32"), np.arange(90) % 3
pgc_mpi.fit(lambda: nn.Sequential(nn.Linear(4, width), nn.Linear(width, 3)), (x, y), **pgc_mpi.options_from_args())
""")
    proc = run_mpi(3, [str(script), "--steps", "5", "--out", str(tmp_path / "run")])
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and "rank 1 built a model with 4 parameter tensors (75 numbers), rank 0 one with 4 " \
                                "(67)" in errors[0], proc.stderr[-2000:]


def test_pgc_sim_simulates_your_model_loss_and_data():
    cmd = [sys.executable, "-m", "pgc_mpi", "sim", "--model", f"{NETS}:make_model", "--loss", f"{NETS}:focal_loss",
           "--dataset", f"{NETS}:digits", "-n", "4", "--schemes", "dgd,pgc-cr", "--steps", "20", "--eval-every", "10"]
    proc = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("dgd ", "pgc-cr "))]
    assert [r[0] for r in rows] == ["dgd", "pgc-cr"]
    assert "make_model on" in proc.stderr and "2730 parameters" in proc.stderr
