"""Workers that are gone: declared lost after --lost-after seconds of silence, back when heard again.

Slow is not gone. Every worker sends rank 0 a heartbeat from a thread of its own
(pgc_mpi.runtime.transport.Heartbeat, four a lost_after and at least one a second) whatever it is
doing, so a computation of any length, an injected delay or a wait for the model is never taken
for a death: the clock counts the time since the worker was last heard from (a heartbeat or a
message), not the time since its model went out. What silences a worker is its process or node
gone (a segfault, the OOM killer, a node that reboots or drops off the network), or frozen
(SIGSTOP, a node swapping to a halt, an injected hang). Under `srun --kill-on-bad-exit=0` the rest
of the job lives on (see docs/ALGORITHMS.md, "A worker that dies"); a coded scheme decodes
without it anyway (a permanent straggler), and the master names it: a warning and a
`worker_lost` event in the metrics. A lost worker that is heard again (a frozen one continued)
comes back: a `worker_back` event, and it counts again in deciding whether a step can complete.
When the workers still missing from a step are all lost (dgd, more than s lost, a pbs partition
whose every holder is lost), the step can never complete: the run ends with a checkpoint, its
summary names the workers lost at that moment, and the batch script starts it again on the
workers that are left (an elastic restart: pgc_mpi.runs.checkpoint.load).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

log = logging.getLogger("pgc_mpi")


class LostWorkers:
    """Which workers are declared lost (since when), from when each was last heard from."""

    def __init__(self, n: int, lost_after: float | None, placement: list[list[int]], first_rank: int):
        self.n, self.lost_after, self.placement, self.first_rank = n, lost_after, placement, first_rank
        self.lost: dict[int, int] = {}  # worker -> the step it was declared lost at
        self._since: dict[int, float] = {}  # worker -> when it was declared lost (time.monotonic)

    def declare(self, step: int, heard: Sequence[float], write: Callable[[dict], None] | None) -> None:
        """Declare the workers silent for longer than lost_after lost (once each), and the lost ones
        heard from since back, telling the log and the metrics (`heard`: when each worker was last
        heard from, time.monotonic; `write`: the metrics writer's write, or None)."""
        if self.lost_after is None:
            return
        now = time.monotonic()
        for worker in range(self.n):
            rank = worker + self.first_rank
            if worker in self.lost:
                if heard[worker] > self._since[worker]:
                    self._back(step, worker, rank, now, write)
            elif now - heard[worker] >= self.lost_after:
                self.lost[worker], self._since[worker] = step, now
                log.warning("step %d: worker %d (rank %d) has not been heard from for %.0f s (no heartbeat, no "
                            "message): declared lost (its process or node is gone or frozen?); it counts as a "
                            "permanent straggler until it is heard again", step, worker, rank, now - heard[worker])
                if write is not None:
                    write({"event": "worker_lost", "step": step, "worker": worker, "rank": rank,
                           "silent_for": round(now - heard[worker], 3)})

    def _back(self, step: int, worker: int, rank: int, now: float, write) -> None:
        lost_at, since = self.lost.pop(worker), self._since.pop(worker)
        log.warning("step %d: worker %d (rank %d), lost since step %d, is heard again after %.0f s: it counts "
                    "again", step, worker, rank, lost_at, now - since)
        if write is not None:
            write({"event": "worker_back", "step": step, "worker": worker, "rank": rank, "lost_at": lost_at,
                   "lost_for": round(now - since, 3)})

    def stuck(self, waiting: list[int], waits_on: str) -> bool:
        """Whether a step still waiting for `waiting` (workers, or pbs's partitions) can never
        complete: every worker it waits for (every holder of a partition) is lost."""
        if not self.lost or not waiting:
            return False
        if waits_on == "partitions":
            return any(all(w in self.lost for w, held in enumerate(self.placement) if p in held) for p in waiting)
        return all(w in self.lost for w in waiting)
