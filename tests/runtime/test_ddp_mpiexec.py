"""`pgc-train --scheme ddp` (pgc_mpi.runtime.ddp), the torch DistributedDataParallel peer baseline, end to end
under mpiexec: dgd's trajectory, the slowest worker setting the pace, the outputs, the options it refuses.

Each test launches bounded mpiexec jobs (helpers.run_train); one module-scoped pair of jobs (dgd and
ddp on the same settings) serves the trajectory and output tests.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pgc_mpi.config import SimConfig, TrainConfig
from pgc_mpi.core.message import MessageRecord
from pgc_mpi.errors import ConfigError
from pgc_mpi.sim.cli import main as sim_main

from helpers import events_of, run_train, steps_of

STEPS = 12
SHARED = ["--steps", str(STEPS), "--dtype", "float64", "--batch-size", "16", "--lr", "0.5", "--seed", "3",
          "--record-params", "--eval-every", "5"]


def _pair(root: Path, ranks: int, extra: list[str]) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """dgd and ddp on the same settings: (dgd's run directory, ddp's, ddp's job)."""
    dgd, ddp = root / "dgd", root / "ddp"
    proc = run_train(ranks, ["--scheme", "dgd", *SHARED, *extra, "--out", str(dgd)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_train(ranks, ["--scheme", "ddp", *SHARED, *extra, "--out", str(ddp)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dgd, ddp, proc


@pytest.fixture(scope="module")
def sgd_pair(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    return _pair(tmp_path_factory.mktemp("sgd"), 5, [])


def _same_trajectory(dgd: Path, ddp: Path) -> None:
    want, got = np.load(dgd / "params.npy"), np.load(ddp / "params.npy")
    assert got.shape == want.shape == (STEPS + 1, want.shape[1])
    assert np.abs(got - want).max() < 1e-10
    assert np.abs(got[-1] - got[0]).max() > 1e-3  # it did train


def test_ddp_follows_dgds_trajectory(sgd_pair):
    """No delays, float64: DDP's allreduce mean and the workers' own SGD steps give the master's
    parameters at every step, the initial ones included; so do the minibatch losses."""
    dgd, ddp, _ = sgd_pair
    _same_trajectory(dgd, ddp)
    losses = [(a["train_loss"], b["train_loss"]) for a, b in zip(steps_of(dgd), steps_of(ddp), strict=True)]
    assert np.allclose(*zip(*losses), rtol=0, atol=1e-10)


def test_ddp_follows_dgds_trajectory_with_adam(tmp_path):
    """The workers' FlatOptimizer is the master's, Adam's moments included (3 ranks: 2 workers)."""
    dgd, ddp, _ = _pair(tmp_path, 3, ["--optimizer", "adam", "--lr", "0.05"])
    _same_trajectory(dgd, ddp)


def test_ddp_accumulates_micro_batches_as_dgd_does(tmp_path):
    """--accumulate 3: each peer's gradient is the mean of its 3 micro-batches (dgd's draws), then
    one all-reduce: dgd's trajectory and losses."""
    dgd, ddp, _ = _pair(tmp_path, 4, ["--accumulate", "3", "--batch-size", "8"])
    _same_trajectory(dgd, ddp)
    losses = [(a["train_loss"], b["train_loss"]) for a, b in zip(steps_of(dgd), steps_of(ddp), strict=True)]
    assert np.allclose(*zip(*losses), rtol=0, atol=1e-10)


def test_ddp_writes_the_outputs_of_every_scheme(sgd_pair):
    dgd, ddp, proc = sgd_pair
    config = json.loads((ddp / "config.json").read_text())
    assert config["config"]["scheme"] == "ddp" and config["workers"] == 4 and config["world_size"] == 5
    steps = steps_of(ddp)
    assert [r["step"] for r in steps] == list(range(STEPS))
    assert set(steps_of(dgd)[0]) <= set(steps[0])  # every field of dgd's record, and allreduce_time
    for r in steps:
        assert r["arrivals"] == r["used"] == [0, 1, 2, 3]
        assert (r["late"], r["rejected"], r["stale_rejected"]) == (0, [], 0)
        assert (r["deadline_missed"], r["partial"], r["residual"], r["max_staleness"]) == (False, False, 0.0, 0)
        assert r["step_time"] > 0 and r["decode_time"] == 0.0 and r["allreduce_time"] >= 0
        messages = [MessageRecord._make(m) for m in r["messages"]]
        assert [(m.worker, m.step, m.gradients, m.verdict) for m in messages] == [(i, r["step"], 1, "used")
                                                                                    for i in range(4)]
        assert all(m.delay == 0 and m.compute_time > 0 for m in messages)
        assert all(m.data_wait == 0.0 for m in messages)  # held rows: slicing them is computation
    assert [r["wall_time"] for r in steps] == sorted(r["wall_time"] for r in steps)
    assert steps[-1]["bytes_received"] == STEPS * 4 * 650 * 8  # 650 logreg parameters in float64
    assert [e["step"] for e in events_of(ddp, "eval")] == [4, 9, 11]
    summary = events_of(ddp, "summary")[0]
    assert summary["status"] == "completed" and summary["steps"] == STEPS and summary["final_test_accuracy"] > 0.5
    assert f"pgc-train: ddp (n=4) on digits/logreg: {STEPS} steps" in proc.stdout


def test_the_slowest_ddp_worker_sets_the_pace(tmp_path):
    """A fixed 0.4 s delay on worker 1: every step waits for it (as dgd's master does), and the
    delay is logged apart from the compute time."""
    proc = run_train(3, ["--scheme", "ddp", "--steps", "4", "--delay", "fixed:1:0.4", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = steps_of(tmp_path)
    times = [r["step_time"] for r in steps]
    assert len(times) == 4 and all(t > 0.35 for t in times) and np.median(times) > 0.35, times
    for r in steps:
        messages = [MessageRecord._make(m) for m in r["messages"]]
        assert [m.delay for m in messages] == [0.0, 0.4]
        assert all(m.compute_time < 0.3 for m in messages)
    assert events_of(tmp_path, "summary")[0]["median_step_time"] > 0.35


def test_ddp_stops_at_the_target_loss(tmp_path):
    """Every worker stops at the evaluation step that reached the target (rank 0's verdict), and the
    job ends cleanly."""
    proc = run_train(3, ["--scheme", "ddp", "--steps", "500", "--eval-every", "5", "--target-loss", "1.0",
                         "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = events_of(tmp_path, "summary")[0]
    assert summary["stopped_at_target"] and summary["steps"] < 500 and summary["final_train_loss"] <= 1.0
    assert summary["steps"] % 5 == 0 and len(steps_of(tmp_path)) == summary["steps"]


def test_a_stop_signal_ends_a_ddp_run_with_status_3(tmp_path):
    from helpers import leaked_segments, mpich_segments, start_train

    segments = mpich_segments()
    proc = start_train(3, ["--scheme", "ddp", "--steps", "100000", "--delay", "exp:0.01", "--eval-every", "50"],
                       tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err[-3000:]
    assert not leaked_segments(segments)
    summary = events_of(tmp_path, "summary")[0]
    assert summary["status"] == "stopped by SIGTERM" and len(steps_of(tmp_path)) == summary["steps"] > 0


@pytest.mark.parametrize("option,value", [
    ("resume", "latest"), ("deadline", 1.0), ("checkpoint_every", 10), ("fault", "nan:0@3"),
])
def test_ddp_refuses_the_options_it_does_not_support(option, value):
    cfg = TrainConfig(scheme="ddp", out="runs/x", **{option: value})
    with pytest.raises(ConfigError, match=f"^--{option.replace('_', '-')} is not supported with --scheme ddp$"):
        cfg.validate(4)


def test_ddp_ignores_the_coded_schemes_options():
    """s, c and the staleness options describe coded schemes: ddp takes any (s may exceed n)."""
    TrainConfig(scheme="ddp", stragglers=7, c=3, max_staleness=0, fr_decode="n-s").validate(2)
    with pytest.raises(ConfigError, match="--adapt applies only to pbs"):
        TrainConfig(scheme="ddp", adapt=True).validate(2)


def test_the_simulator_does_not_run_ddp(capsys):
    with pytest.raises(ConfigError, match="'ddp' runs only under pgc-train"):
        SimConfig(scheme="ddp")
    assert sim_main(["--schemes", "dgd,ddp"]) == 2
    assert "ddp" in capsys.readouterr().err


def test_an_unsupported_option_is_one_clear_error_from_the_job(tmp_path):
    proc = run_train(3, ["--scheme", "ddp", "--deadline", "1", "--out", str(tmp_path)], timeout=60)
    assert proc.returncode == 2
    assert "pgc-train: error: --deadline is not supported with --scheme ddp" in proc.stderr
    assert proc.stderr.count("error") == 1 and "Traceback" not in proc.stderr
