"""Lost workers (pgc_mpi.runtime.lost) and die faults across a resume (pgc_mpi.core.faults.for_start)."""

from __future__ import annotations

import time

from pgc_mpi.core.faults import Fault, for_start
from pgc_mpi.runtime.lost import LostWorkers


def test_a_worker_silent_past_lost_after_is_declared_once_and_back_once_heard_again():
    gone = LostWorkers(3, 0.05, [[0, 1], [1, 2], [2, 0]], first_rank=1)
    events = []
    now = time.monotonic()
    heard = [now, now, now]
    gone.declare(7, heard, events.append)
    assert gone.lost == {} and events == []  # not silent for long enough yet
    time.sleep(0.06)
    heard[0] = heard[2] = time.monotonic()  # heartbeats from workers 0 and 2: worker 1 is silent
    gone.declare(8, heard, events.append)
    gone.declare(9, heard, events.append)
    assert gone.lost == {1: 8}
    assert [(e["event"], e["worker"], e["rank"], e["step"]) for e in events] == [("worker_lost", 1, 2, 8)]
    heard[1] = time.monotonic() + 1e-6  # a frozen worker continued: heard again
    gone.declare(12, heard, events.append)
    assert gone.lost == {}
    assert (events[-1]["event"], events[-1]["worker"], events[-1]["lost_at"]) == ("worker_back", 1, 8)
    gone.declare(13, heard, events.append)
    assert len(events) == 2  # heard again once: back once


def test_a_step_is_stuck_only_when_everything_it_waits_for_is_lost():
    placement = [[0, 1], [1, 2], [2, 0]]
    gone = LostWorkers(3, None, placement, first_rank=1)
    gone.declare(0, [0.0, 0.0, 0.0], None)  # no --lost-after: nobody is ever declared
    assert gone.lost == {}
    gone.lost = {1: 5}
    assert gone.stuck([1], "workers") and not gone.stuck([1, 2], "workers") and not gone.stuck([], "workers")
    # pbs waits for partitions: one is stuck when every worker holding it is lost
    assert not gone.stuck([1, 2], "partitions")
    gone.lost = {1: 5, 2: 6}
    assert gone.stuck([2], "partitions") and not gone.stuck([0], "partitions")


def test_a_die_fault_does_not_fire_again_in_a_start_past_its_step():
    faults = (Fault("die", 1, 200), Fault("nan", 0, 100))
    assert for_start(faults, 0) == faults and for_start(faults, 199) == faults
    assert for_start(faults, 200) == (Fault("nan", 0, 100),)


def test_a_fault_naming_a_worker_a_restart_lacks_is_dropped_but_a_fresh_start_refuses_it(tmp_path):
    """An elastic restart after worker 2's death may run on 2 workers: its fault names a worker that
    start does not have (it has happened) and is dropped; a fresh start, --resume auto on a new
    folder included, refuses it as a typo."""
    import pytest

    from pgc_mpi.config import TrainConfig
    from pgc_mpi.core.faults import parse_faults
    from pgc_mpi.errors import ConfigError
    from pgc_mpi.job.startup import configure
    from pgc_mpi.runs import run_lock

    assert parse_faults("die:2@100+nan:0@5", 2, elastic=True) == [Fault("nan", 0, 5)]
    with pytest.raises(ConfigError, match="worker id 2 is outside 0..1"):
        parse_faults("die:2@100", 2)
    cfg = TrainConfig(scheme="dgd", problem="quadratic", fault="die:2@100", resume="auto", out=str(tmp_path / "new"))
    cfg.validate(2)  # a resume may be a restart on fewer workers: whether it is one, the folder says
    try:
        with pytest.raises(ConfigError, match="worker id 2 is outside 0..1"):
            configure(lambda: cfg, ranks=3, prog="pgc-train")
    finally:
        run_lock.release_all()
