"""pgc-train end to end under mpiexec: trajectories, stragglers, hangs, deadlines, bad input.

Each test launches a bounded mpiexec job (MPIEXEC_TIMEOUT plus a subprocess timeout).
"""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from pgc_mpi.core.message import GRADIENT_FIELDS
from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.learning.datasets import load_digits
from pgc_mpi.learning.torch_problem import TorchProblem
from pgc_mpi.runs.metrics import MASTER_PARTS
from pgc_mpi.sim.replaying import replay

from helpers import events_of, mpi_env, run_logistic, run_train, steps_of

ROOT = Path(__file__).resolve().parents[2]


# The NumPy logistic problem (its workers never import torch: a job starts in half the time),
# except one case on the torch model, for the torch worker's gradients under MPI.
@pytest.mark.parametrize("scheme,ranks,s,straggler,fr_decode,correction,problem", [
    ("dgd", 5, 1, False, "covered", "none", "logistic"), ("is-sgd", 5, 1, True, "covered", "none", "logistic"),
    ("gc-fr", 5, 1, True, "covered", "none", "logistic"), ("gc-cr", 5, 1, True, "covered", "none", "logistic"),
    ("is-gc-fr", 5, 1, False, "covered", "none", "logistic"), ("is-gc-cr", 5, 1, False, "covered", "none", "logistic"),
    ("pgc-fr", 5, 1, True, "covered", "none", "logistic"), ("pgc-cr", 5, 1, True, "covered", "none", "logreg"),
    ("pgc-cr", 4, 2, False, "covered", "none", "logistic"), ("gc-cr", 7, 2, False, "covered", "none", "logistic"),
    ("pgc-fr", 7, 2, False, "n-s", "none", "logistic"), ("pgc-fr", 5, 1, True, "covered", "weights:0.3", "logistic"),
])
def test_mpi_trajectory_equals_the_simulator(tmp_path, scheme, ranks, s, straggler, fr_decode, correction, problem):
    """float64: replaying the run's arrivals and buffer versions in the simulator reproduces the MPI
    master's parameters at every step. With a random 0.4 s straggler (one job, both checks) a coded
    scheme also does not wait for it: its median step stays well below the delay (steps take
    10-50 ms; a longer delay shows the same and only makes the run longer). With the paper's
    FR rule (--fr-decode n-s) every step waits for n - s arrivals, and config.json says so. With a
    staleness correction the workers weigh their buffers by age (catch-up refreshes included) as the
    simulator does."""
    out = tmp_path / "run"
    steps = 20 if straggler else 12
    args = ["--scheme", scheme, "-s", str(s), "--steps", str(steps), "--dtype", "float64", "--batch-size", "16",
            "--lr", "0.5", "--seed", "3", "--record-params", "--eval-every", "100", "--fr-decode", fr_decode,
            "--staleness-correction", correction, "--out", str(out)]
    if problem == "logistic":
        args += ["--problem", "logistic"]
    if straggler:
        args += ["--delay", "random:1:0.4", "--grace", "5"]
    proc = run_train(ranks, args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n = ranks - 1
    model = (run_logistic(n, batch_size=16, seed=3) if problem == "logistic" else
             TorchProblem("logreg", load_digits(3), n, 16, seed=3, dtype="float64"))
    expected = replay(make_scheme(scheme, n, s, seed=3, fr_decode=fr_decode, staleness_correction=correction),
                      model, steps_of(out), lr=0.5)
    got = np.load(out / "params.npy")
    assert got.shape == (steps + 1, model.dim)
    assert np.abs(got - np.stack(expected)).max() < 1e-10
    assert np.abs(got[-1] - got[0]).max() > 1e-3  # it did train
    assert json.loads((out / "config.json").read_text())["staleness_correction"] == correction
    for r in steps_of(out):  # the master's own work is part of the step, every part of it measured
        parts = [r[f"{part}_time"] for part in MASTER_PARTS]
        assert all(p >= 0 for p in parts) and 0 < sum(parts) <= r["step_time"], r
    if straggler:
        median = np.median([r["step_time"] for r in steps_of(out)])
        assert median < 0.2, median
    if scheme.startswith("pgc-"):  # staleness stays within the window c - 1 = s by default
        assert all(r["max_staleness"] <= s for r in steps_of(out))
    if scheme.startswith("pgc-") and straggler:  # the straggler misses steps and catches up (--on-stale refresh)
        assert sum(r["refreshed"] for r in steps_of(out)) > 0
    if fr_decode == "n-s":
        assert all(len(r["arrivals"]) >= n - s for r in steps_of(out))
        assert json.loads((out / "config.json").read_text())["config"]["fr_decode"] == "n-s"


def test_dgd_waits_for_the_random_straggler(tmp_path):
    proc = run_train(5, ["--scheme", "dgd", "--steps", "2", "--delay", "random:1:2.0", "--problem", "logistic",
                         "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    times = [r["step_time"] for r in steps_of(tmp_path)]
    assert len(times) == 2 and all(t > 1.5 for t in times), times  # every step waits
    assert np.median(times) > 1.5


def test_dgd_with_a_hung_worker_fails_at_the_deadline(tmp_path):
    proc = run_train(5, ["--scheme", "dgd", "--steps", "20", "--delay", "hang:1@3", "--problem", "logistic",
                         "--deadline", "1", "--on-deadline", "fail", "--out", str(tmp_path)])
    assert proc.returncode != 0
    assert "could not decode by the deadline" in proc.stderr and "missing workers [1]" in proc.stderr
    assert len(steps_of(tmp_path)) == 3
    summary = events_of(tmp_path, "summary")[-1]  # the folder says how its run ended
    assert summary["status"] == "failed" and "could not decode by the deadline" in summary["reason"]
    assert summary["rank"] == 0


def test_dgd_partial_decoding_at_the_deadline(tmp_path):
    proc = run_train(5, ["--scheme", "dgd", "--steps", "6", "--delay", "hang:1@3", "--problem", "logistic",
                         "--deadline", "0.5", "--on-deadline", "partial", "--grace", "2", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    late = steps_of(tmp_path)[3:]
    assert all(r["partial"] and r["residual"] > 0 and r["used"] == [0, 2, 3] for r in
               [{**r, "used": sorted(r["used"])} for r in late])


def test_pbs_trains(tmp_path):
    """Replication and window set apart, the window bounds every step's oldest entry, every step has
    a new gradient, and the diagnostics are in every step record (probes at evaluation steps)."""
    proc = run_train(5, ["--scheme", "pbs", "--replication", "2", "--c", "3", "--steps", "60", "--eval-every", "30",
                         "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    evals = events_of(tmp_path, "eval")
    # it trained: an untrained 10-class model's loss is about ln 10 = 2.30; the loss after 60 steps varies
    # with the arrival order (0.56-0.67 measured), so the bound leaves room for it
    assert evals[-1]["train_loss"] < 0.5 * math.log(10) and evals[-1]["test_accuracy"] > 0.6
    steps = steps_of(tmp_path)
    assert all(r["max_staleness"] <= 2 and r["new_gradients"] >= 1 for r in steps)
    assert all(r["grad_norm_sq"] > 0 and "displacement" in r for r in steps)
    assert [r["step"] for r in steps if "error_bound" in r] == [29, 59]
    shape = json.loads((tmp_path / "config.json").read_text())
    assert (shape["c"], shape["replication"], shape["window"], shape["max_staleness_steps"]) == (2, 2, 3, 2)


def test_target_loss_stops_early(tmp_path):
    proc = run_train(5, ["--steps", "500", "--eval-every", "5", "--target-loss", "1.0", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = events_of(tmp_path, "summary")[0]
    assert summary["stopped_at_target"] and summary["steps"] < 500 and summary["final_train_loss"] <= 1.0


@pytest.fixture(scope="module")
def local_toml_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, set[str]]:
    """One job for two tests: launch/local.sh 3 (4 ranks) with a TOML config and a flag that overrides it."""
    from helpers import leaked_segments, mpich_segments

    root = tmp_path_factory.mktemp("local")
    cfg = root / "run.toml"
    cfg.write_text('scheme = "gc-cr"\nsteps = 7\nlr = 0.2\neval-every = 100\n')
    segments = mpich_segments()
    proc = subprocess.run([str(ROOT / "launch" / "local.sh"), "3", "--config", str(cfg), "--steps", "5",
                           "--out", str(root / "o")], env=mpi_env(120), capture_output=True, text=True, timeout=150)
    return proc, root / "o", leaked_segments(segments)


def test_local_launcher(local_toml_run):
    proc, out, leaked = local_toml_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not leaked, sorted(leaked)
    assert len(steps_of(out)) == 5
    bad = subprocess.run([str(ROOT / "launch" / "local.sh"), "zero"], capture_output=True, text=True, timeout=10)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_toml_config_and_flag_precedence(local_toml_run):
    proc, out, _ = local_toml_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    resolved = json.loads((out / "config.json").read_text())["config"]
    assert resolved["scheme"] == "gc-cr" and resolved["steps"] == 5 and resolved["lr"] == 0.2
    assert len(steps_of(out)) == 5


# Every configuration error is checked in-process in test_config.py; these jobs check end to end
# that rank 0 reports it in one line and the job exits non-zero (a flag argparse rejects, a world
# size that does not fit; a data file in test_too_small_data_file_gives_one_clear_error).
@pytest.mark.parametrize("ranks,args,message", [
    (5, ["--bogus"], "unrecognized arguments: --bogus"),
    (1, [], "at least 2 MPI ranks"),
])
def test_bad_input_gives_one_clear_error(ranks, args, message):
    began = time.monotonic()
    proc = run_train(ranks, args, timeout=60)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("error") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - began < 60


def test_too_small_data_file_gives_one_clear_error(tmp_path):
    """A data file rank 0 opens and finds too small for the world size (bad files, image models on
    flat samples and TOML errors are checked in-process in test_config.py)."""
    from data_prep.__main__ import main as prep

    tiny = tmp_path / "tiny.h5"
    assert prep(["synthetic", "--samples", "4", "--features", "3", "--out", str(tiny)]) == 0
    proc = run_train(5, ["--dataset", str(tiny)], timeout=60)
    assert proc.returncode != 0 and "3 training samples, fewer than the 4 partitions" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("error") == 1


def test_readme_quick_start_command_runs(tmp_path):
    """The README's quick-start training command (after the install), verbatim, in a scratch directory."""
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    install = next(k for k, line in enumerate(lines) if "pip install torch==2.13.0" in line)
    command = lines[install + 1].strip()  # the quick start's second line: run the default job
    assert command == "launch/local.sh 4", command
    args = shlex.split(command)
    proc = subprocess.run([str(ROOT / args[0]), *args[1:]], env=mpi_env(180), capture_output=True, text=True,
                          timeout=200, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "test accuracy" in proc.stdout
    assert list((tmp_path / "runs").glob("local-*/metrics.jsonl"))


def _stop(proc: subprocess.Popen, out: Path, sig: str, segments: set[str]) -> str:
    """Send `sig`; the run must stop cleanly, ask for a requeue, and checkpoint on the way out. Returns stderr."""
    import signal

    from helpers import leaked_segments

    began = time.monotonic()
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 3, err[-3000:]
    assert not leaked_segments(segments)  # the stop aborts the job: nothing may be left in /dev/shm
    assert time.monotonic() - began < 30
    summary = events_of(out, "summary")[0]
    assert summary["status"] == f"stopped by {sig}" and 0 < summary["steps"] < 100000
    assert len(steps_of(out)) == summary["steps"]
    assert f"{sig} received" in err
    assert (out / "checkpoints" / f"ckpt-{summary['steps']:08d}.h5").is_file()  # written on the way out
    return err


def test_a_stop_signal_ends_the_run_cleanly_and_asks_for_a_requeue(tmp_path):
    """SIGUSR1 here; SIGTERM ends test_a_checkpoint_on_demand_and_training_goes_on's job, with the same checks."""
    from helpers import mpich_segments, start_train

    segments = mpich_segments()
    proc = start_train(4, ["--steps", "100000", "--delay", "exp:0.01", "--eval-every", "50", "--checkpoint-every",
                           "1000000", "--problem", "logistic"], tmp_path, wait=60)
    _stop(proc, tmp_path, "SIGUSR1", segments)


def test_ctrl_c_stops_like_sigterm_without_a_traceback(tmp_path):
    """SIGINT to mpiexec (Ctrl-C in a terminal; scancel --signal=INT): forwarded to every rank, it
    stops the run as SIGTERM does, with a checkpoint, exit status 3 and no traceback; the line
    before MPI's abort banner says the stop was intended."""
    from helpers import mpich_segments, start_train

    segments = mpich_segments()
    proc = start_train(4, ["--steps", "100000", "--delay", "exp:0.01", "--eval-every", "50", "--checkpoint-every",
                           "1000000", "--problem", "logistic"], tmp_path, wait=60)
    err = _stop(proc, tmp_path, "SIGINT", segments)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "stopped by SIGINT as requested; the MPI_Abort message that follows is intended" in err


def test_a_checkpoint_on_demand_and_training_goes_on(tmp_path):
    from helpers import mpich_segments, start_train

    segments = mpich_segments()
    proc = start_train(4, ["--steps", "100000", "--delay", "exp:0.01", "--eval-every", "1000",
                                "--problem", "logistic"], tmp_path, wait=60)
    until = time.monotonic() + 60
    (tmp_path / "CHECKPOINT").touch()
    while time.monotonic() < until and not list((tmp_path / "checkpoints").glob("ckpt-*.h5")):
        time.sleep(0.2)
    written = len(steps_of(tmp_path))
    time.sleep(2)
    assert len(steps_of(tmp_path)) > written  # still training
    assert not (tmp_path / "CHECKPOINT").exists()
    _stop(proc, tmp_path, "SIGTERM", segments)
    assert len(list((tmp_path / "checkpoints").glob("ckpt-*.h5"))) == 2  # on demand, then on the way out


@pytest.mark.parametrize("scheme,wire", [("pgc-cr", "bfloat16"), ("pbs", "float16")])
def test_narrow_wire_messages_are_rounded_by_workers_and_widened_by_the_master(tmp_path, scheme, wire):
    """--wire-dtype: every gradient message is the header plus 2 bytes per parameter, the master
    accumulates in --dtype float64, and a coded run equals its replay with the same rounding."""
    out = tmp_path / "run"
    steps, n = 12, 4
    proc = run_train(n + 1, ["--scheme", scheme, "-s", "1", "--steps", str(steps), "--dtype", "float64",
                             "--wire-dtype", wire, "--batch-size", "16", "--lr", "0.5", "--seed", "3",
                             "--record-params", "--eval-every", "100", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "config.json").read_text())["config"]["wire_dtype"] == wire
    records = steps_of(out)
    problem = TorchProblem("logreg", load_digits(3), n, 16, seed=3, dtype="float64")
    messages = sum(len(r["messages"]) for r in records)
    header = 8 * (len(GRADIENT_FIELDS) + (1 if scheme == "pbs" else 2))  # the named fields, then one version per buffer
    assert records[-1]["bytes_received"] == messages * (header + 2 * problem.dim)
    assert all(m[5] != "rejected" for r in records for m in r["messages"])
    assert all(0 < r["wire_error"] < 0.05 for r in records)  # estimated, from the decode weights
    got = np.load(out / "params.npy")
    assert got.dtype == np.float64 and np.abs(got[-1] - got[0]).max() > 1e-3  # the master's dtype; it trained
    if scheme != "pbs":  # pbs has no replay: its table rule depends on arrival times as well
        expected = np.stack(replay(make_scheme(scheme, n, 1, seed=3), problem, records, lr=0.5, wire_dtype=wire))
        assert np.abs(got - expected).max() < 1e-10


def test_a_narrow_wire_that_gc_cr_amplifies_is_said_in_the_log_and_the_records(tmp_path):
    """gc-cr with n = 4, s = 2, seed 0 decodes workers 0 and 2 with a weight of 36/n: each of their
    messages' rounding enters the gradient 36 times over. Workers 1 and 3 are held back so that
    every step decodes from that pair."""
    out = tmp_path / "run"
    proc = run_train(5, ["--scheme", "gc-cr", "-s", "2", "--seed", "0", "--steps", "3", "--wire-dtype", "bfloat16",
                         "--delay", "fixed:1,3:0.3", "--eval-every", "100", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = steps_of(out)
    assert all(sorted(r["used"]) == [0, 2] for r in records)
    assert all(r["wire_error"] == pytest.approx(2.0**-8 * 36.11, rel=1e-3) for r in records)
    assert "gc-cr's decode weights" in proc.stderr and "amplify bfloat16's rounding" in proc.stderr
