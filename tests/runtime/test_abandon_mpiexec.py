"""--abandon-late under MPI: a straggler whose step is decided drops it at a check point, sends
nothing for it, and its next message is for the newest model; decoding stays what the scheme's
rule makes of the messages that came (pgc_mpi.runtime.abandon, docs/ALGORITHMS.md §11)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pgc_mpi.core.message import MessageRecord
from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.learning.problems import Accumulated
from pgc_mpi.sim.replaying import replay

from helpers import events_of, run_logistic, run_train, steps_of


def _messages(out, worker: int | None = None) -> list[MessageRecord]:
    return [m for r in steps_of(out) for m in map(MessageRecord._make, r["messages"])
            if worker is None or m.worker == worker]


ABANDONING = ("is-sgd", "gc-fr", "gc-cr", "is-gc-fr", "is-gc-cr", "pgc-fr", "pgc-cr")


@pytest.mark.parametrize(("scheme", "bound"), [(name, "window") for name in ABANDONING] + [("pgc-fr", "none")])
def test_abandoned_steps_leave_decoding_as_the_scheme_makes_it(tmp_path, scheme, bound):
    """float64, delays of mean 2x the emulated 50 ms a gradient, 4 micro-batches per gradient (8
    check points a gradient job): workers drop decided jobs, and replaying the messages that came
    (their steps and buffer versions) in the simulator gives the MPI master's parameters at every
    step: nothing of a dropped job reached a message, and every message sent is one the scheme
    decodes as without the flag. With --max-staleness none a pgc worker drops wherever it is told
    (nothing is refreshed), and its buffers grow older than the window."""
    out = tmp_path / "run"
    steps = 16
    proc = run_train(5, ["--scheme", scheme, "-s", "1", "--steps", str(steps), "--dtype", "float64",
                         "--problem", "logistic", "--batch-size", "16", "--accumulate", "4", "--lr", "0.5",
                         "--seed", "3", "--record-params", "--eval-every", "100",
                         "--compute-time", "0.05", "--delay", "exp:0.1", "--abandon-late", "--grace", "5",
                         "--max-staleness", bound, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = steps_of(out)
    assert sum(r["abandoned"] for r in records) >= 3, [r["abandoned"] for r in records]
    problem = Accumulated(run_logistic(4, batch_size=16, seed=3), 4)
    expected = replay(make_scheme(scheme, 4, 1, seed=3), problem, records, lr=0.5)
    got = np.load(out / "params.npy")
    assert got.shape == (steps + 1, problem.dim)
    assert np.abs(got - np.stack(expected)).max() < 1e-10
    if scheme.startswith("pgc-") and bound == "window":  # a dropped slot is refreshed before it is sent
        assert all(r["max_staleness"] <= 1 for r in records)
    elif scheme.startswith("pgc-"):
        assert max(r["max_staleness"] for r in records) > 1
    summary = events_of(out, "summary")[0]
    assert summary["abandoned_jobs"] == sum(r["abandoned"] for r in records) and "decided jobs abandoned" in proc.stdout


@pytest.mark.parametrize("servers", [1, 2])
def test_a_straggler_sends_only_its_first_job_and_resumes_the_same_way(tmp_path, servers):
    """pgc-cr, worker 0 always 0.4 s slow: its first job of a start is never dropped (it fills the
    pipeline's empty slot) and arrives late; every later job is told it is decided before its
    check point and dropped, so worker 0 sends one message per start, and every other worker's
    message is for the step it arrives in. The same with --servers 2 (each server tells it; it
    drops a job once both have), and over a checkpoint and resume."""
    out = tmp_path / "run"
    base = ["--scheme", "pgc-cr", "-s", "1", "--problem", "quadratic", "--compute-time", "0.05",
            "--delay", "fixed:0:0.4", "--abandon-late", "--checkpoint-every", "10", "--eval-every", "100",
            "--grace", "5", "--out", str(out)]
    if servers > 1:
        base += ["--servers", str(servers)]
    ranks = 4 + servers
    for steps in (20, 40):  # a second start resumes from the first's last checkpoint
        proc = run_train(ranks, [*base, "--steps", str(steps), *(["--resume", "auto"] if steps > 20 else [])])
        assert proc.returncode == 0, proc.stderr[-3000:]
    records = steps_of(out)
    assert [r["step"] for r in records] == list(range(40))
    mine = _messages(out, worker=0)
    assert len(mine) == 2 and {m.verdict for m in mine} == {"late"}, mine
    # a job of 0.45 s told within about 50 ms, dropped at its check point 0.15 s in: after the first
    # job's 0.45 s, about one drop per 0.15 s of the 1 s a start takes
    assert sum(r["abandoned"] for r in records) >= 4
    others = [(r["step"], m) for r in records for m in map(MessageRecord._make, r["messages"]) if m.worker != 0]
    assert all(m.step == step for step, m in others if m.verdict != "late")
    assert events_of(out, "summary")[-1]["status"] == "completed"
    assert json.loads((out / "config.json").read_text())["config"]["abandon_late"] is True


def test_dgd_and_pbs_take_the_flag_and_never_abandon():
    from pgc_mpi.config import TrainConfig

    assert [name for name in ("dgd", "ddp", "pbs", "is-sgd", "pgc-fr")
            if TrainConfig(scheme=name, abandon_late=True).abandons_late()] == ["is-sgd", "pgc-fr"]
    assert not TrainConfig(scheme="pgc-fr").abandons_late()


def test_a_worker_drops_a_decided_job_where_the_scheme_says_it_is_worth_it():
    """The MPI worker's check (pgc_mpi.runtime.worker_job.WorkerJob), here on MPI_COMM_SELF with one
    server's notice sent to itself: a job is dropped only once its step is decided, and where
    dropping costs a gradient later (a pgc slot past the staleness bound), only with more than one
    partition gradient of it left. At a real check point the rest is the micro-batches' pace extrapolated, at least
    --compute-time's, and the delay after it."""
    import time

    from mpi4py import MPI

    from pgc_mpi.core.jobs import Job
    from pgc_mpi.runtime.abandon import Abandoned, DecidedWatch
    from pgc_mpi.runtime.tags import TAG_DECIDED
    from pgc_mpi.runtime.worker_job import WorkerJob

    comm = MPI.COMM_SELF
    watch = DecidedWatch(comm, servers=1)
    began = time.perf_counter()

    def check(drop_costs: bool, began: float = began, step: int = 5, gradients: int = 1) -> WorkerJob:
        return WorkerJob(Job(0, step, tuple(range(gradients)), began, delay=0.05, compute_time=0.1, micro_batches=4,
                             abandonable=True, drop_costs=drop_costs), watch)

    check(False).at(left=1.0, gradient_time=0.1)  # not decided yet: nothing is dropped
    notice = np.array([5], dtype=np.int64)  # a send to oneself completes once it is received
    sent = comm.Isend([notice, MPI.INT64_T], dest=0, tag=TAG_DECIDED)
    check(False, step=6).at(left=1.0, gradient_time=0.1)  # a later step's job is not decided
    with pytest.raises(Abandoned):
        check(False).at(left=0.01, gradient_time=0.1)  # dropping costs nothing (is-sgd, gc-*): any decided job
    check(True).at(left=0.1, gradient_time=0.1)  # dropping costs a gradient: a gradient left is kept
    with pytest.raises(Abandoned):
        check(True).at(left=0.11, gradient_time=0.1)
    with pytest.raises(Abandoned):  # 10 ms into 0.15 s (0.1 s floor + delay): 0.14 s left
        check(True, began=time.perf_counter() - 0.01).check(done=1)
    check(True, began=time.perf_counter() - 0.09).check(done=3)  # 0.08 s left of a 0.12 s gradient
    # a slow real pace is the gradient's cost too: 3 of 4 micro-batches in 0.3 s leave 0.15 s of a
    # 0.4 s gradient (kept); with a refresh before the fresh slot, 3 of 8 leave 0.55 s (dropped)
    check(True, began=time.perf_counter() - 0.3).check(done=3)
    with pytest.raises(Abandoned):
        check(True, began=time.perf_counter() - 0.3, gradients=2).check(done=3)
    sent.Wait()
