"""A worker rank: newest model in, one (or c) partition gradients computed, a coded message out."""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core.abandon import drop_costs_a_gradient
from ..core.faults import Fault, active, for_start
from ..core.message import Message
from ..core.schemes import CodedScheme, PbsScheme
from ..core.stragglers import DelayModel
from ..core.wire import FLOAT16_MAX
from ..errors import PgcError
from ..learning.problems import Accumulated, Problem, expect_draws, take_data_wait
from .abandon import Abandoned
from .transport import WorkerTransport
from .worker_job import JobSettings, WorkerJob, WorkerJobs

if TYPE_CHECKING:
    from ..config import TrainConfig

log = logging.getLogger("pgc_mpi")


@dataclass(frozen=True)
class WorkerSettings:
    """What a worker does besides computing: the catch-up of over-stale buffers
    (`refresh_over`: the staleness over which a pipelined worker recomputes a buffer before it
    sends, --on-stale refresh; None: never), `max_staleness` (the staleness bound: where dropping
    a pipelined job costs a gradient), --prefetch and how its jobs run (pgc_mpi.runtime.worker_job)."""

    refresh_over: int | None = None
    max_staleness: int | None = None  # --max-staleness in steps (None: no bound)
    prefetch: int | None = None  # --prefetch: the jobs ahead whose minibatches are named (None: no loaders)
    jobs: JobSettings = JobSettings()

    @classmethod
    def of(cls, cfg: TrainConfig, scheme: CodedScheme | PbsScheme, loads_ahead: bool = False) -> WorkerSettings:
        """A run's worker settings; `loads_ahead`: the worker's problem has loaders
        (pgc_mpi.learning.minibatches)."""
        return cls(cfg.refresh_over(scheme), cfg.staleness_bound(scheme), cfg.prefetch if loads_ahead else None,
                   JobSettings.of(cfg))


def _jobs(worker: int, link: WorkerTransport, delays: DelayModel, settings: JobSettings) -> WorkerJobs:
    """The worker's jobs, told of by every server over the link's communicator."""
    return WorkerJobs(settings, worker, delays, link.comm, len(link.shards), link.stop_requested, link.fall_silent)


def _compute(problem: Problem, w: np.ndarray, part: int, draw: int, job: WorkerJob) -> tuple[float, np.ndarray]:
    """A partition gradient; with --accumulate, the job's two hooks run between its micro-batches
    (pgc_mpi.learning.problems.Accumulated: the abandon's check, DropCompute's stop)."""
    if isinstance(problem, Accumulated):
        return problem.loss_and_grad(w, part, draw, check=job.check, stop=job.stop)
    return problem.loss_and_grad(w, part, draw)


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
               delays: DelayModel, settings: WorkerSettings | None = None, faults: tuple[Fault, ...] = ()) -> int:
    """Serve the master until it says stop; returns how many gradients were computed. `faults`:
    those injected into this run (pgc_mpi.core.faults), whatever worker they name."""
    settings = settings or WorkerSettings()
    if isinstance(scheme, PbsScheme):
        return _run_table_worker(worker, scheme, problem, link, delays, settings, faults)
    coded = CodedWorker(worker, scheme, problem, link, delays, settings, faults)
    step = coded.start()
    while step is not None:
        job = coded.plan(step)
        try:
            losses, (took, real, slept) = coded.compute(job)
        except Abandoned:  # nothing of the job is kept or sent: the master answers with the newest model
            coded.jobs.dropped(step)
        else:
            coded.send(job, losses, took, real, slept)
        step = link.next_model()
    coded.close()
    return coded.computed


class CodedWorker:
    """A coded scheme's worker (every scheme but pbs): its stored partitions' buffers and their
    versions, and its jobs: each computes the job's slots at the newest model and sends their
    coded combination (pgc_mpi.core.schemes: which slots, which coefficients)."""

    def __init__(self, worker: int, scheme: CodedScheme, problem: Problem, link: WorkerTransport,
                 delays: DelayModel, settings: WorkerSettings, faults: tuple[Fault, ...] = ()):
        self.injected = faults
        self.worker, self.scheme, self.problem, self.link = worker, scheme, problem, link
        self.settings, self.jobs = settings, _jobs(worker, link, delays, settings.jobs)
        self.parts = scheme.placement[worker]
        dtype = link.model.dtype  # the run's: gradients are computed and combined in it, then put on the wire
        # the coefficients of a message depend on the step only through its place in the rotation
        self.coefs = [scheme.message_coefficients(worker, phase).astype(dtype) for phase in range(scheme.c)]
        self.buffers = np.zeros((scheme.c, problem.dim), dtype=dtype)
        self.versions: list[int] = []
        self.computed = 0
        self.data_wait = 0.0  # of the job just computed: seconds spent getting its minibatches

    def start(self) -> int | None:
        """The first model's step (None: stop at once), after the pipeline's stale buffers are
        computed at it: step 0, or the step a resumed run starts at."""
        step = self.first = self.link.next_model()
        self.faults = for_start(self.injected, step or 0)
        if step is None:
            return None
        self.versions = self.scheme.warmup_versions(step)
        began = time.perf_counter()
        slots = self.scheme.warmup_slots(self.worker, step)
        warmup = [(self.parts[k], self.scheme.draw_index(self.versions[k], k)) for k in slots]
        self.expect(step, self.scheme.fresh_slots(step, self.worker), before=warmup)
        for k, (part, draw) in zip(slots, warmup):
            self.buffers[k] = self.problem.loss_and_grad(self.link.model, part, draw)[1]
        self.computed += len(slots)
        self.jobs.warm_up(began, len(slots), take_data_wait(self.problem))
        return step

    def plan(self, step: int) -> WorkerJob:
        """The job for `step`: its slots (catch-up ones first), and whether it may be abandoned
        (never a worker's first job of a start: pgc_mpi.core.abandon) and at what cost."""
        settings, scheme = self.settings, self.scheme
        slots = scheme.job_slots(self.worker, step, self.versions, settings.refresh_over, self.first)
        abandonable = self.jobs.abandons and step != self.first
        costs = abandonable and drop_costs_a_gradient(scheme, self.worker, step, slots, self.versions,
                                                      settings.max_staleness, self.first)
        self.expect(step, slots)
        take_data_wait(self.problem)  # what an abandoned job waited is not this job's
        return self.jobs.start_job(step, slots, abandonable, costs)

    def expect(self, step: int, slots: tuple[int, ...], before: list[tuple[int, int]] | None = None) -> None:
        """With loaders (--prefetch): the minibatches of the job at `step` (its `slots`, after
        `before`) and of the fresh slots of the --prefetch steps after it, which the next jobs
        compute unless this worker falls behind (its loaders then drop them)."""
        if self.settings.prefetch is None:
            return
        jobs = [(step, slots)] + [(later, self.scheme.fresh_slots(later, self.worker))
                                  for later in range(step + 1, step + 1 + self.settings.prefetch)]
        draws = list(before or ()) + [(self.parts[k], self.scheme.draw_index(at, k)) for at, ks in jobs for k in ks]
        expect_draws(self.problem, draws)

    def compute(self, job: WorkerJob) -> tuple[list[float], tuple[float, float, float]]:
        """(the slots' losses, (compute time, real compute time, delay)): the job's gradients into
        their buffers, their coded combination on the wire, the rest of the job emulated. An
        abandoned job (Abandoned) puts back the buffers and versions it overwrote."""
        step = job.job.step
        kept = [(k, self.buffers[k].copy(), self.versions[k]) for k in job.job.slots] if job.watch else []
        losses: list[float] = []
        try:
            for k in job.job.slots:
                loss, self.buffers[k] = _compute(self.problem, self.link.model, self.parts[k],
                                                 self.scheme.draw_index(step, k), job)
                self.versions[k] = step
                losses.append(loss)
                job.gradient_done()
            np.dot(self.coefs[step % self.scheme.c], self.buffers, out=self.link.coded)
            _put_on_wire(self.link, self.link.coded)
            self.data_wait = take_data_wait(self.problem)
            return losses, job.finish(self.data_wait)
        except Abandoned:
            for k, row, version in kept:
                self.buffers[k], self.versions[k] = row, version
            raise

    def send(self, job: WorkerJob, losses: list[float], took: float, real: float, slept: float) -> None:
        """The job's message: its header, then the payload put on the wire by `compute`."""
        self.computed += len(losses)
        self.link.write_header(Message(job.job.step, self.worker, tuple(self.versions), loss=float(np.mean(losses)),
                                       compute_time=took, delay=slept, gradients=len(losses), real_compute_time=real,
                                       computed_share=job.share(), data_wait=self.data_wait))
        _send(self.link, self.faults, self.worker, job.job.step)

    def close(self) -> None:
        """At the stop: receive the notices and the threshold still on their way, confirm the stop."""
        self.jobs.close()
        self.link.confirm_stop()


def _run_table_worker(worker: int, scheme: PbsScheme, problem: Problem, link: WorkerTransport,
                      delays: DelayModel, settings: WorkerSettings, injected: tuple[Fault, ...]) -> int:
    """pbs: compute the next stored partition at the model the master answered with, again and
    again (the answer to the message that completes a step is the updated model). With --servers K
    every server answers every message with its shard of the same step (pgc_mpi.runtime.servers): a model
    put together from shards of different steps is a fault of the servers, not a straggler's lot."""
    version = _one_step(link, link.next_model())
    faults = for_start(injected, version or 0)
    jobs = _jobs(worker, link, delays, settings.jobs)
    count = 0
    attempts = 0
    while version is not None:
        slot = scheme.fresh_slots(count, worker)[0]
        part = scheme.placement[worker][slot]
        if settings.prefetch is not None:  # the draws of its next computations, whatever their models
            expect_draws(problem, [(scheme.partition_for(worker, m), scheme.draw_index(m, m % scheme.c))
                                   for m in range(count, count + 1 + settings.prefetch)])
        job = jobs.start_job(version, (slot,), number=count, attempt=attempts)
        loss, grad = problem.loss_and_grad(link.model, part, scheme.draw_index(count, slot))
        _put_on_wire(link, grad)
        waited = take_data_wait(problem)
        took, real, slept = job.finish(waited)
        link.write_header(Message(version, worker, (version,), partition=part, loss=loss, compute_time=took,
                                  delay=slept, real_compute_time=real, data_wait=waited))
        _send(link, faults, worker, version)
        count += 1
        answer = _one_step(link, link.next_model())
        attempts = attempts + 1 if answer == version else 0
        version = answer
    jobs.close()
    link.confirm_stop()
    return count
