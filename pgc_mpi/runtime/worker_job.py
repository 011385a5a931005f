"""The jobs of an MPI worker (the parameter server's and ddp's): their emulation, their check points
and DropCompute's stop, in two objects.

A worker makes its jobs with one WorkerJobs, built from its JobSettings: it begins each job (its
injected delay, DropCompute's threshold of the moment, the servers' notices for a job that may be
abandoned), tells the servers of a job dropped, and receives what is still on its way at the stop.
The worker itself only says which slots a job computes and whether it may be abandoned.

A WorkerJob holds the job's plan (pgc_mpi.core.jobs.Job) and owns what happens to it on a real
clock: --compute-time's floor and the injected delay are slept (`finish`); with --abandon-late the
servers' "step decided" notices are looked for at its check points (`check`, which raises
Abandoned: the first hook); with --drop-compute no micro-batch starts past the threshold
(`stop`, which answers True: the second hook). The worker passes both hooks to the computation
(pgc_mpi.learning.problems.Accumulated) and never decides either itself.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mpi4py import MPI

from ..core.jobs import Job
from ..core.stragglers import DelayModel
from .abandon import Abandoned, DecidedWatch
from .drop_threshold import threshold_watch

if TYPE_CHECKING:
    from ..config import TrainConfig

log = logging.getLogger("pgc_mpi")


def never() -> bool:
    """An `interrupted` that never interrupts."""
    return False


def _say_nothing() -> None:
    """A `fall_silent` with nothing to silence."""


def sleep_until(until: float, interrupted: Callable[[], bool] = never) -> None:
    """Sleep until time.perf_counter() == until, or until `interrupted()` (the master asks to stop:
    whatever the worker was waiting for would be discarded anyway)."""
    while time.perf_counter() < until and not interrupted():
        time.sleep(min(0.01, max(0.0, until - time.perf_counter())))


def injected_delay(seconds: float, interrupted: Callable[[], bool] = never,
                   fall_silent: Callable[[], None] = _say_nothing) -> float:
    """Sleep like a slow node. A hang (math.inf) never wakes, as a frozen node would not, and says
    nothing more (`fall_silent`: its heartbeats end, so rank 0 declares it lost); a finite delay
    ends early once `interrupted()`. Returns the delay."""
    if seconds == math.inf:
        log.warning("injected hang: this worker stops responding now")
        fall_silent()
        while True:
            time.sleep(3600)
    sleep_until(time.perf_counter() + seconds, interrupted)
    return seconds


def pad_compute(began: float, gradients: float, per_gradient: float | None,
                interrupted: Callable[[], bool] = never, waited: float = 0.0) -> tuple[float, float]:
    """(compute time, real compute time) of `gradients` gradients computed since `began`: with
    --compute-time (`per_gradient`) the worker first sleeps out the rest of gradients x
    per_gradient, so ranks sharing cores behave like nodes with a fixed cost per partition gradient.
    That cost is the model's computation: the `waited` seconds spent getting the minibatches come
    on top of it, as a node's data loading does (and loaders that read ahead take them away)."""
    real = time.perf_counter() - began
    if per_gradient is not None:
        sleep_until(began + waited + gradients * per_gradient, interrupted)
    return time.perf_counter() - began, real


class WorkerJob:
    """One job on a real clock (see the module): `check` and `stop` are the computation's two hooks,
    `finish` emulates the rest of the job once its gradients are computed."""

    def __init__(self, job: Job, watch: DecidedWatch | None = None, interrupted: Callable[[], bool] = never,
                 fall_silent: Callable[[], None] = _say_nothing):
        """`watch`: the servers' notices (--abandon-late, a job that may be abandoned); `interrupted`:
        whether the master asks to stop (sleeps end early); `fall_silent`: a hang's silence."""
        self.job, self.interrupted, self.fall_silent = job, interrupted, fall_silent
        self.watch = watch if job.abandonable else None
        self.limit = job.kept_micro_batches()  # --drop-compute's, in emulated time
        self.done = job.micro_batches  # micro-batches computed of each gradient (fewer once stopped)
        self.finished = 0  # partition gradients computed whole (their micro-batches count for `check`)

    @property
    def began(self) -> float:
        """When the job began (time.perf_counter())."""
        return self.job.began

    def check(self, done: int) -> None:
        """The first hook, --abandon-late: a check point of the real computation, after `done`
        micro-batches of the gradient under way (and all those of the finished ones). The job's
        compute is their pace extrapolated (at least its --compute-time), its delay after it;
        raises Abandoned where the step is decided and enough of the job is left."""
        if self.watch is None:
            return
        job, now = self.job, time.perf_counter()
        total, done = job.gradients * job.micro_batches, self.finished * job.micro_batches + done
        compute = max((now - job.began) * total / done, job.compute_floor)
        self.at(job.began + compute + job.delay - now, compute / job.gradients)

    def gradient_done(self) -> None:
        """A partition gradient is computed: between two of them is a check point too."""
        self.finished += 1
        if self.finished < self.job.gradients:
            self.check(0)

    def stop(self, done: int) -> bool:
        """The second hook, --drop-compute: whether the gradient under way starts no more
        micro-batches after `done` (the threshold, in emulated time or on the real clock)."""
        job = self.job
        if job.threshold is not None and (done >= self.limit or time.perf_counter() - job.began > job.threshold):
            self.done = done
            return True
        return False

    def share(self) -> float:
        """The share of its micro-batches the job computed (1 unless DropCompute stopped it)."""
        return self.done / self.job.micro_batches

    def finish(self, waited: float = 0.0) -> tuple[float, float, float]:
        """The rest of a job whose gradients are computed, `waited` seconds of it spent getting
        minibatches: (compute time, real compute time, delay). It sleeps out --compute-time (on
        top of the wait: pad_compute) and then the injected delay; with --abandon-late, or
        a share of the micro-batches computed below 1 (--drop-compute), the delay is slowness of
        the computation instead: the computed share of the job's span is slept, through its check
        points, where the job may be abandoned (Abandoned). A hang checks nothing."""
        job, share = self.job, self.share()
        if (self.watch is None and share == 1.0) or job.delay == math.inf:
            took, real = pad_compute(job.began, job.gradients, job.compute_time, self.interrupted, waited)
            return took, real, injected_delay(job.delay, self.interrupted, self.fall_silent)
        now = time.perf_counter()
        real = now - job.began
        took, delay = max(real, waited + share * job.compute_floor), share * job.delay
        until = job.began + took + delay
        for point in job.check_points(until, after=now):
            sleep_until(point, self.interrupted)
            if self.watch is not None:
                self.at(until - point, took / job.gradients)
        sleep_until(until, self.interrupted)
        return took, real, delay

    def at(self, left: float, gradient_time: float) -> None:
        """A check point with `left` seconds of the job still to run, of `gradient_time` a gradient."""
        if self.watch.decided(self.job.step) and self.job.drops_at(left, gradient_time):
            raise Abandoned(self.job.step)


@dataclass(frozen=True)
class JobSettings:
    """How a worker's jobs run besides their computation: --compute-time (every partition gradient
    takes at least this many seconds; None: as long as it takes), --accumulate (the micro-batches of
    a partition gradient: its check points), --abandon-late (drop a decided job at a check point:
    pgc_mpi.runtime.abandon) and --drop-compute (DropCompute's threshold in seconds, or auto)."""

    compute_time: float | None = None
    micro_batches: int = 1
    abandon_late: bool = False
    drop_compute: float | str | None = None

    @classmethod
    def of(cls, cfg: TrainConfig) -> JobSettings:
        """A run's job settings."""
        return cls(cfg.compute_time, cfg.accumulate, cfg.abandons_late(), cfg.drop_compute)


class WorkerJobs:
    """One worker's jobs, begun one after the other (see the module)."""

    def __init__(self, settings: JobSettings, worker: int, delays: DelayModel, comm: MPI.Comm, servers: int = 1,
                 interrupted: Callable[[], bool] = never, fall_silent: Callable[[], None] = _say_nothing):
        """`comm`: where rank 0 sends DropCompute's threshold and the `servers` (ranks 0..servers-1)
        their notices; `interrupted`, `fall_silent`: as WorkerJob's."""
        self.settings, self.worker, self.delays = settings, worker, delays
        self.interrupted, self.fall_silent = interrupted, fall_silent
        self.watch = DecidedWatch(comm, servers) if settings.abandon_late else None
        self.thresholds = threshold_watch(comm, settings.drop_compute)

    @property
    def abandons(self) -> bool:
        """Whether a job may be dropped once its step is decided (--abandon-late)."""
        return self.watch is not None

    def start_job(self, step: int, slots: tuple[int, ...], abandonable: bool = False, drop_costs: bool = False,
                  number: int = 0, attempt: int = 0) -> WorkerJob:
        """The job computing `slots` for the model of `step` begins now: `abandonable` (never a
        worker's first job of a start: pgc_mpi.core.abandon), at the cost `drop_costs` says;
        `number`: the worker's jobs before it; `attempt`: its computations at `step` before it (pbs)."""
        settings = self.settings
        threshold = self.thresholds.threshold() if self.thresholds is not None else None
        job = Job(self.worker, step, slots, time.perf_counter(), self.delays.delay(self.worker, step, attempt),
                  settings.compute_time, settings.micro_batches, abandonable and self.abandons, drop_costs, threshold,
                  number=number)
        return WorkerJob(job, self.watch, self.interrupted, self.fall_silent)

    def warm_up(self, began: float, gradients: int, waited: float = 0.0) -> None:
        """A pipelined worker's warm-up, `gradients` computed since `began`: --compute-time's floor
        is slept out as a job's (pad_compute); warm-up has no delay and no check points."""
        pad_compute(began, gradients, self.settings.compute_time, self.interrupted, waited)

    def dropped(self, step: int) -> None:
        """The job for `step` was abandoned: tell the servers (they answer with the newest model)."""
        self.watch.answer(step)

    def close(self) -> None:
        """At the stop: receive the notices and the threshold still on their way."""
        if self.watch is not None:
            self.watch.drain()
        if self.thresholds is not None:
            self.thresholds.threshold()  # received, if it came after the last job
