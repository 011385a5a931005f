"""Workers that are gone: declared lost after --lost-after seconds without an answer.

A worker process that dies (a segfault, the OOM killer, a node that reboots) sends nothing
more; under `srun --kill-on-bad-exit=0` the rest of the job lives on (see docs/ALGORITHMS.md,
"A worker that dies"), and nothing tells the master but the silence. A coded scheme decodes
without it anyway (a permanent straggler); the master names it once it has had a model for
`lost_after` seconds without answering: a warning and a `worker_lost` event in the metrics.
When the workers still missing from a step are all lost (dgd, more than s lost, a pbs partition
whose every holder is lost), the step can never complete: the run ends with a checkpoint, its
summary says which workers were lost, and the batch script starts it again on the workers that
are left (an elastic restart: pgc_mpi.runs.checkpoint.load).
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("pgc_mpi")


class LostWorkers:
    """Who has had a model out for how long, and who is declared lost."""

    def __init__(self, n: int, lost_after: float | None, placement: list[list[int]], first_rank: int):
        self.lost_after, self.placement, self.first_rank = lost_after, placement, first_rank
        self.out_since: list[float | None] = [None] * n  # when the unanswered model went out
        self.lost: dict[int, int] = {}  # worker -> the step it was declared lost at

    def sent(self, worker: int) -> None:
        self.out_since[worker] = time.monotonic()

    def answered(self, worker: int) -> None:
        self.out_since[worker] = None

    def declare(self, step: int, write) -> None:
        """Declare the workers silent for longer than lost_after lost (once each), telling the log
        and the metrics (`write`: the metrics writer's write, or None on a follower)."""
        if self.lost_after is None:
            return
        now = time.monotonic()
        for worker, since in enumerate(self.out_since):
            if since is None or worker in self.lost or now - since < self.lost_after:
                continue
            self.lost[worker] = step
            log.warning("step %d: worker %d (rank %d) has not answered for %.0f s: declared lost (its process or "
                        "node is gone?); it counts as a permanent straggler", step, worker,
                        worker + self.first_rank, now - since)
            if write is not None:
                write({"event": "worker_lost", "step": step, "worker": worker, "rank": worker + self.first_rank,
                       "silent_for": round(now - since, 3)})

    def stuck(self, waiting: list[int], waits_on: str) -> bool:
        """Whether a step still waiting for `waiting` (workers, or pbs's partitions) can never
        complete: every worker it waits for (every holder of a partition) is lost."""
        if not self.lost or not waiting:
            return False
        if waits_on == "partitions":
            return any(all(w in self.lost for w, held in enumerate(self.placement) if p in held) for p in waiting)
        return all(w in self.lost for w in waiting)
