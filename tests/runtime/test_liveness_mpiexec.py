"""Slow is not gone (pgc_mpi.runtime.lost): a computation longer than --lost-after is no loss,
and a frozen worker that is continued comes back. Every job is bounded (MPIEXEC_TIMEOUT and a
subprocess timeout)."""

from __future__ import annotations

import json
import os
import signal
import time

from helpers import events_of, run_train, start_train, steps_of


def test_a_computation_longer_than_lost_after_is_not_a_loss(tmp_path):
    """dgd waits for every worker: were a 1.5 s step taken for silence past --lost-after 0.5, the
    run would end at step 0 with exit 5 (workers lost). The heartbeats keep the workers alive."""
    out = tmp_path / "run"
    proc = run_train(4, ["--scheme", "dgd", "--compute-time", "1.5", "--lost-after", "0.5", "--steps", "2",
                         "--problem", "logistic", "--eval-every", "1000", "--out", str(out)], timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["step"] for r in steps_of(out)] == [0, 1]
    assert min(r["step_time"] for r in steps_of(out)) > 1.4  # the computation did take longer than lost_after
    assert events_of(out, "worker_lost") == [] and "declared lost" not in proc.stderr


def _worker_pids(out) -> list[int]:
    """The pids of the workers (ranks 1..n), from config.json's provenance."""
    until = time.monotonic() + 30
    while time.monotonic() < until:
        try:
            ranks = json.loads((out / "config.json").read_text())["provenance"]["ranks"]
            return [r["pid"] for r in ranks[1:]]
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    raise AssertionError("config.json has no ranks")


def _freeze(pid: int, seconds: float) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_frozen_workers_are_lost_then_back_and_the_run_completes(tmp_path):
    """pgc-cr, s = 1, 4 workers: worker 1 frozen past --lost-after and continued, then worker 2.
    Only one is ever gone at once, which s = 1 tolerates: two worker_lost and two worker_back
    events, and every step done (before, the first stayed lost and the second freeze ended the run)."""
    out = tmp_path / "run"
    job = start_train(5, ["--scheme", "pgc-cr", "-s", "1", "--lost-after", "1", "--compute-time", "0.02",
                          "--delay", "exp:0.02", "--steps", "220", "--eval-every", "1000", "--seed", "3",
                          "--problem", "logistic"], out)
    try:
        pids = _worker_pids(out)
        _freeze(pids[1], 2.5)
        time.sleep(1.5)
        _freeze(pids[2], 2.5)
        _, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err[-3000:]
    lost, back = events_of(out, "worker_lost"), events_of(out, "worker_back")
    assert [e["worker"] for e in lost] == [1, 2] and [e["worker"] for e in back] == [1, 2], (lost, back)
    assert all(b["step"] >= a["step"] and b["lost_at"] == a["step"] for a, b in zip(lost, back, strict=True))
    assert [r["step"] for r in steps_of(out)] == list(range(220))
    assert "is heard again" in err
    summary = events_of(out, "summary")[-1]
    assert summary["status"] == "completed", summary
