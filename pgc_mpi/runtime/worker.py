"""A worker rank: newest model in, one (or c) partition gradients computed, a coded message out."""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core.abandon import drop_costs_a_gradient
from ..core.drop_compute import micro_batches_done
from ..core.faults import Fault, active, for_start, parse_faults
from ..core.message import Message
from ..core.schemes import CodedScheme, PbsScheme
from ..core.stragglers import DelayModel
from ..core.wire import FLOAT16_MAX
from ..errors import PgcError
from ..learning.problems import Accumulated, Problem
from .abandon import Abandoned, DecidedWatch, JobCheck, remaining_check_points
from .drop_threshold import threshold_watch
from .transport import WorkerTransport

if TYPE_CHECKING:
    from ..config import TrainConfig

log = logging.getLogger("pgc_mpi")

@dataclass(frozen=True)
class WorkerSettings:
    """What a worker does besides computing: injected faults, the catch-up of over-stale buffers
    (`refresh_over`: the staleness over which a pipelined worker recomputes a buffer before it
    sends, --on-stale refresh; None: never), emulated compute (`compute_time`: every
    partition gradient takes at least this many seconds, --compute-time; None: as long as it takes)
    and --abandon-late (`abandon_late`, with the check points of `micro_batches` per gradient;
    `max_staleness`, the staleness bound, says where dropping a pipelined job costs a gradient)."""

    faults: tuple[Fault, ...] = ()
    refresh_over: int | None = None
    compute_time: float | None = None
    micro_batches: int = 1  # --accumulate: the micro-batches of a partition gradient (its check points)
    abandon_late: bool = False  # drop a decided job at a check point (pgc_mpi.runtime.abandon)
    drop_compute: float | str | None = None  # DropCompute's threshold in seconds, or auto (core.drop_compute)
    max_staleness: int | None = None  # --max-staleness in steps (None: no bound)

    @classmethod
    def of(cls, cfg: TrainConfig, scheme: CodedScheme | PbsScheme) -> WorkerSettings:
        """A run's worker settings (a resumed start drops faults that name a worker it lacks)."""
        return cls(tuple(parse_faults(cfg.fault, scheme.n, elastic=cfg.resume is not None)), cfg.refresh_over(scheme),
                   cfg.compute_time, cfg.accumulate, cfg.abandons_late(), cfg.drop_compute,
                   cfg.staleness_bound(scheme))


def _never() -> bool:
    return False


def _sleep_until(until: float, interrupted: Callable[[], bool]) -> None:
    """Sleep until time.perf_counter() == until, or until `interrupted()` (the master asks to stop:
    whatever the worker was waiting for would be discarded anyway)."""
    while time.perf_counter() < until and not interrupted():
        time.sleep(min(0.01, max(0.0, until - time.perf_counter())))


def injected_delay(seconds: float, interrupted: Callable[[], bool] = _never,
                   fall_silent: Callable[[], None] = lambda: None) -> float:
    """Sleep like a slow node. A hang (math.inf) never wakes, as a frozen node would not, and says
    nothing more (`fall_silent`: its heartbeats end, so rank 0 declares it lost); a finite delay
    ends early once `interrupted()`. Returns the delay."""
    if seconds == math.inf:
        log.warning("injected hang: this worker stops responding now")
        fall_silent()
        while True:
            time.sleep(3600)
    _sleep_until(time.perf_counter() + seconds, interrupted)
    return seconds


def pad_compute(began: float, gradients: float, per_gradient: float | None,
                interrupted: Callable[[], bool] = _never) -> tuple[float, float]:
    """(compute time, real compute time) of `gradients` gradients computed since `began`: with
    --compute-time (`per_gradient`) the worker first sleeps out the rest of gradients x
    per_gradient, so ranks sharing cores behave like nodes with a fixed cost per partition gradient."""
    real = time.perf_counter() - began
    if per_gradient is not None:
        _sleep_until(began + gradients * per_gradient, interrupted)
    return time.perf_counter() - began, real


def emulate_job(began: float, gradients: int, settings: WorkerSettings, delay: float, link: WorkerTransport,
                check: JobCheck | None = None, done: float = 1.0) -> tuple[float, float, float]:
    """The rest of a job whose gradients are computed: (compute time, real compute time, delay).
    It sleeps out --compute-time and then the injected `delay`; with a `check` (--abandon-late)
    or `done` < 1 (the share of the micro-batches --drop-compute let it compute) the delay is
    slowness of the computation instead: the job's share `done` of the span is slept, through
    its check points (pgc_mpi.core.abandon), where `check` may raise Abandoned. A hang checks nothing."""
    if (check is None and done == 1.0) or delay == math.inf:
        took, real = pad_compute(began, gradients, settings.compute_time, link.stop_requested)
        return took, real, injected_delay(delay, link.stop_requested, link.fall_silent)
    now = time.perf_counter()
    real = now - began
    took, delay = max(real, done * gradients * (settings.compute_time or 0.0)), done * delay
    until = began + took + delay
    for point in remaining_check_points(began, until, gradients * settings.micro_batches, now):
        _sleep_until(point, link.stop_requested)
        if check is not None:
            check.at(until - point, took / gradients)
    _sleep_until(until, link.stop_requested)
    return took, real, delay


def _gradient(problem: Problem, w: np.ndarray, part: int, draw: int,
              between: Callable[[int], bool | None] | None) -> tuple[float, np.ndarray]:
    """A partition gradient; with --accumulate, `between` runs between its micro-batches
    (pgc_mpi.learning.problems.Accumulated: an abandon's check, or DropCompute's stop)."""
    if isinstance(problem, Accumulated) and between is not None:
        return problem.loss_and_grad(w, part, draw, between=between)
    return problem.loss_and_grad(w, part, draw)


def _between_micro_batches(check: JobCheck, finished: list[float], micro_batches: int) -> Callable[[int], None]:
    """An abandon's check as Accumulated's `between` (it raises or lets the job go on): after
    `done` micro-batches of the gradient under way and all of the `finished` ones."""
    return lambda done: check.computed(len(finished) * micro_batches + done)


class Dropping:
    """--drop-compute: whether a job starts no more micro-batches (pgc_mpi.core.drop_compute), in
    emulated time (the job's compute and delay spread over its micro-batches) or real time."""

    def __init__(self, began: float, job: float, micro_batches: int, threshold: float):
        self.began, self.threshold, self.micro_batches = began, threshold, micro_batches
        self.limit = micro_batches_done(job, micro_batches, threshold)
        self.done = micro_batches

    def __call__(self, done: int) -> bool:
        if done >= self.limit or time.perf_counter() - self.began > self.threshold:
            self.done = done
            return True
        return False

    def share(self) -> float:
        return self.done / self.micro_batches


def _send(link: WorkerTransport, faults: tuple[Fault, ...], worker: int, step: int) -> None:
    """Send the message in the link's buffers, spoiled first if a fault is injected here."""
    kind = active(faults, worker, step)
    if kind in ("die", "kill"):
        log.warning("injected fault: this worker dies now")
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(17)
    if kind in ("nan", "inf"):  # in every server's part, as a real NaN gradient would be
        for payload in link.payloads:
            link.wire.encode(np.array([np.nan if kind == "nan" else np.inf]), payload[:1])
    link.send(nbytes=link.nbytes // 2 if kind == "badsize" else None)


def _put_on_wire(link: WorkerTransport, values: np.ndarray) -> None:
    """Round the message's values into the link's payload in the wire format; say so (once) when
    float16's range is exceeded: the master then rejects the message as non-finite."""
    link.put(values)
    if (link.wire.name == "float16" and not all(np.isfinite(p).all() for p in link.payloads)
            and np.isfinite(values).all()):
        _tell_float16_overflow()


@functools.cache
def _tell_float16_overflow() -> None:
    log.warning("a coded gradient exceeds float16's range (+-%g): the master rejects such messages as non-finite; "
                "use --wire-dtype bfloat16 (float32's range) or float32", FLOAT16_MAX)


def _one_step(link: WorkerTransport, version: int | None) -> int | None:
    """`version`, the model's step, once every server's shard of it is of that step (pbs)."""
    if version is not None and link.sharded and len(set(link.shard_steps)) > 1:
        raise PgcError(f"pbs: the servers answered with shards of steps {link.shard_steps}: they must answer every "
                       f"message with the same model")
    return version


def run_worker(worker: int, scheme: CodedScheme | PbsScheme, problem: Problem, link: WorkerTransport,
               delays: DelayModel, settings: WorkerSettings | None = None) -> int:
    """Serve the master until it says stop; returns how many gradients were computed."""
    settings = settings or WorkerSettings()
    if isinstance(scheme, PbsScheme):
        return _run_table_worker(worker, scheme, problem, link, delays, settings)
    parts = scheme.placement[worker]
    dtype = link.model.dtype  # the run's: gradients are computed and combined in it, then put on the wire
    coef = scheme.coefficients(worker).astype(dtype)
    buffers = np.zeros((scheme.c, problem.dim), dtype=dtype)
    coded = link.coded
    step = first = link.next_model()
    faults = for_start(settings.faults, first or 0)
    computed = 0
    watch = DecidedWatch(link.comm, len(link.shards)) if settings.abandon_late else None
    thresholds = threshold_watch(link.comm, settings.drop_compute)
    if step is not None:  # the first model: step 0, or the step a resumed run starts at
        versions = scheme.warmup_versions(step)
        began = time.perf_counter()
        for k in scheme.warmup_slots(worker, step):  # the pipeline's stale buffers, at this model
            buffers[k] = problem.loss_and_grad(link.model, parts[k], scheme.draw_index(versions[k], k))[1]
            computed += 1
        pad_compute(began, computed, settings.compute_time, link.stop_requested)
    while step is not None:
        began = time.perf_counter()
        catch_up = scheme.refresh_slots(worker, step, versions, settings.refresh_over, first)
        slots = (*catch_up, *scheme.fresh_slots(step, worker))
        delay = delays.delay(worker, step)
        floor = len(slots) * (settings.compute_time or 0.0)  # --compute-time's share of the job
        # a worker's first job of a start is never abandoned (pgc_mpi.core.abandon)
        if watch is not None and step != first:
            costs = drop_costs_a_gradient(scheme, worker, step, slots, versions, settings.max_staleness, first)
            check = JobCheck(watch, step, costs, began, len(slots), settings.micro_batches, floor, delay)
        else:
            check = None
        kept = [(k, buffers[k].copy(), versions[k]) for k in slots] if check is not None else []
        threshold = thresholds.threshold() if thresholds is not None else None
        drop = Dropping(began, floor + delay, settings.micro_batches, threshold) if threshold is not None else None
        losses: list[float] = []
        between = drop or (_between_micro_batches(check, losses, settings.micro_batches) if check else None)
        try:
            for k in slots:
                if losses and check is not None:
                    check.computed(len(losses) * settings.micro_batches)
                loss, buffers[k] = _gradient(problem, link.model, parts[k], scheme.draw_index(step, k), between)
                versions[k] = step
                losses.append(loss)
            np.dot(coef, buffers, out=coded)
            _put_on_wire(link, coded)
            took, real, slept = emulate_job(began, len(slots), settings, delay, link, check,
                                            drop.share() if drop else 1.0)
        except Abandoned:  # nothing of the job is kept or sent: the master answers with the newest model
            for k, row, version in kept:
                buffers[k], versions[k] = row, version
            watch.answer(step)
            step = link.next_model()
            continue
        computed += len(losses)
        link.write_header(Message(step, worker, tuple(versions), loss=float(np.mean(losses)), compute_time=took,
                                  delay=slept, gradients=len(losses), real_compute_time=real,
                                  computed_share=drop.share() if drop else 1.0))
        _send(link, faults, worker, step)
        step = link.next_model()
    if watch is not None:
        watch.drain()
    if thresholds is not None:
        thresholds.threshold()  # received, if it came after the last job
    link.confirm_stop()
    return computed


def _run_table_worker(worker: int, scheme: PbsScheme, problem: Problem, link: WorkerTransport,
                      delays: DelayModel, settings: WorkerSettings) -> int:
    """pbs: compute the next stored partition at the model the master answered with, again and
    again (the answer to the message that completes a step is the updated model). With --servers K
    every server answers every message with its shard of the same step (pgc_mpi.runtime.servers): a model
    put together from shards of different steps is a fault of the servers, not a straggler's lot."""
    version = _one_step(link, link.next_model())
    faults = for_start(settings.faults, version or 0)
    count = 0
    attempts = 0
    while version is not None:
        slot = scheme.fresh_slots(count, worker)[0]
        part = scheme.placement[worker][slot]
        began = time.perf_counter()
        loss, grad = problem.loss_and_grad(link.model, part, scheme.draw_index(count, slot))
        _put_on_wire(link, grad)
        took, real = pad_compute(began, 1, settings.compute_time, link.stop_requested)
        slept = injected_delay(delays.delay(worker, version, attempts), link.stop_requested, link.fall_silent)
        link.write_header(Message(version, worker, (version,), partition=part, loss=loss, compute_time=took,
                                  delay=slept, real_compute_time=real))
        _send(link, faults, worker, version)
        count += 1
        answer = _one_step(link, link.next_model())
        attempts = attempts + 1 if answer == version else 0
        version = answer
    link.confirm_stop()
    return count
