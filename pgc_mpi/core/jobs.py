"""A worker's job, as every driver sees it: what it computes, how long its emulation takes, where it
checks for a decided step, and where DropCompute stops it.

One record per job, built when the job begins, read by the MPI worker (pgc_mpi.runtime.worker_job
adds the sleeping and the notices), ddp's workers and the simulator (which keeps one per busy
worker instead of lists indexed by worker). The rules it applies are pgc_mpi.core.abandon's (the
check points, the margin) and pgc_mpi.core.drop_compute's (the micro-batches started by a
threshold); this module only puts a job's numbers in one place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .abandon import abandon_margin, check_points, next_check_point, worth_abandoning
from .drop_compute import micro_batches_done


@dataclass
class Job:
    """One job of one worker, from when it begins (`began`, on the driver's clock)."""

    worker: int
    step: int  # the model version it computes for
    slots: tuple[int, ...]  # the slots it computes, catch-up ones first (a pbs or ddp job: its one slot)
    began: float
    delay: float  # the injected delay: slowness of the computation (math.inf: the worker hangs)
    compute_time: float | None = None  # --compute-time: the least a partition gradient takes (None: as it takes)
    micro_batches: int = 1  # --accumulate: micro-batches per partition gradient
    abandonable: bool = False  # --abandon-late applies to it (never to a worker's first job of a start)
    drop_costs: bool = False  # dropping it costs a partition gradient later (core.abandon.drop_costs_a_gradient)
    threshold: float | None = None  # --drop-compute: no micro-batch starts past it (seconds; None: none)
    until: float | None = None  # when it ends, where the driver knows it ahead (the simulator)
    given: float | None = None  # when its model reached the worker (the simulator's turnarounds start there)
    number: int = 0  # the worker's jobs started before it (pbs's slot rotation; the simulator's event key)

    @property
    def gradients(self) -> int:
        """The partition gradients it computes."""
        return len(self.slots)

    @property
    def compute_floor(self) -> float:
        """--compute-time's share of the job: its gradients times the least one takes (0 without)."""
        return self.gradients * (self.compute_time or 0.0)

    def kept_micro_batches(self) -> int:
        """The micro-batches it starts: all of them, or with --drop-compute those started by the
        threshold, its emulated time (compute floor and delay) spread evenly over them."""
        if self.threshold is None:
            return self.micro_batches
        return micro_batches_done(self.compute_floor + self.delay, self.micro_batches, self.threshold)

    def check_points(self, until: float, after: float = -math.inf) -> list[float]:
        """Its check points (core.abandon.check_points) when it runs until `until`, those after `after`."""
        return [p for p in check_points(self.began, until, self.gradients * self.micro_batches) if p > after]

    def margin(self, gradient_time: float) -> float:
        """What must be left of it for a decided job to be dropped (core.abandon.abandon_margin)."""
        return abandon_margin(self.drop_costs, gradient_time)

    def drops_at(self, left: float, gradient_time: float) -> bool:
        """Whether, decided, it is dropped at a check point with `left` seconds of it still to run."""
        return self.abandonable and worth_abandoning(left, self.margin(gradient_time))

    def stop_point(self, told: float, gradient_time: float) -> float | None:
        """The simulator's: where it stops, told at `told` that its step is decided (its first
        check point from then on that leaves more than the margin), or None (it runs to its end,
        `until`, and its message is late; a hang checks nothing)."""
        if not self.abandonable or self.until is None or self.until == math.inf:
            return None
        return next_check_point(self.began, self.until, self.gradients * self.micro_batches, told,
                                self.margin(gradient_time))
