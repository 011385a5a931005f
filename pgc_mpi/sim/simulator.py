"""Single-process, deterministic simulator of the parameter server, on a simulated clock.

It drives the same scheme objects and the same collectors as the MPI master, with the same
worker semantics: warm-up, slot rotation, stale buffers, decoding from the first arrivals, the
newest-model rule (a worker that finishes late has its message counted and dropped and starts
on the newest model at once), pbs's continuous computation, deadlines and --max-staleness.
A worker's job for step t takes compute_time per fresh partition gradient plus the straggler
model's delay for (worker, t); messages and the master's own work take no simulated time.

Every gradient is really computed, through the Problem protocol (a synthetic convex problem or
a torch model on a data set, torch_problem.TorchProblem), at the model version the scheme prescribes,
and only when the master uses it: a message's payload is handed to the collector as a callable
(collector.resolve), so late, over-stale and uncounted messages cost no gradient. A step record's
`train_loss` is, as in the MPI runtime, the mean minibatch loss of the messages the master used
(the "decoded" training loss); the problem itself is evaluated every `eval_every` steps and after
the last one, into separate evaluation records (SimResult.evals), as pgc-train's eval events.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, partial

import numpy as np

from ..config import SimConfig
from ..core.abandon import drop_costs_a_gradient
from ..core.collector import CodedCollector, Decoded, TableCollector, make_collector
from ..core.drop_compute import fixed_threshold, make_auto
from ..core.jobs import Job
from ..core.message import Layout, Message, buffers_per_message, gradient_header
from ..core.schemes import CodedScheme, PbsScheme
from ..core.stragglers import DelayModel
from ..core.wire import wire_format
from ..errors import ConfigError
from ..learning.diagnostics import TableDiagnostics
from ..learning.optim import make_update
from ..learning.problems import Problem, accuracy_key, loss_key, with_sampling
from ..runs.metrics import master_times
from .master_cost import load as load_master_cost
from .messages import MessageBuilder


@dataclass
class SimResult:
    """Per-step records, evaluations, the final parameters and, if asked for, every step's parameters.

    `evals` holds one record per evaluation: its step, simulated wall time and the problem's
    metrics (`gap`, `train_loss`, `test_loss`, ...); `loss_key` names the loss a target loss is
    checked against."""

    config: SimConfig
    records: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    params: np.ndarray | None = None
    trajectory: list[np.ndarray] = field(default_factory=list)
    stalled: str | None = None
    loss_key: str = "train_loss"

    def first_below(self, key: str, threshold: float) -> dict | None:
        """The first evaluation whose `key` is <= threshold (None if never; NaN never counts)."""
        return next((r for r in self.evals if r.get(key, math.inf) <= threshold), None)

    def final(self, key: str) -> float:
        """The last evaluation's value of `key` (NaN if no evaluation has one)."""
        return next((r[key] for r in reversed(self.evals) if not math.isnan(r.get(key, math.nan))), math.nan)

    def median_step_time(self) -> float:
        """Median simulated time per step."""
        return float(np.median([r["step_time"] for r in self.records])) if self.records else math.nan


class SimWorkers:
    """The workers' side of the simulator: when each job ends and what its message then holds.

    A coded worker's job for step t computes its fresh slots (c gradients for gc-*, one for
    pgc-*), after its over-stale ones with --on-stale refresh; a pbs worker's job is its next
    stored partition at the newest model; the master answers every pbs message at once with the
    current model, except the ones that complete a step (their workers wait for the next). With
    --abandon-late a coded worker whose step is decided stops at its next check point
    (pgc_mpi.core.abandon) and takes the newest model then, keeping nothing of the job. With
    --drop-compute a dgd worker stops its job's micro-batches at the threshold (core.drop_compute).
    Each worker's current job is one record (pgc_mpi.core.jobs.Job, None while it waits), as the
    MPI worker's is.
    """

    def __init__(self, scheme: CodedScheme | PbsScheme, cfg: SimConfig, builder: MessageBuilder):
        self.scheme, self.cfg, self.builder = scheme, cfg, builder
        self.delays = DelayModel(cfg.delay, scheme.n, seed=cfg.seed)
        self.table = isinstance(scheme, PbsScheme)
        n = scheme.n
        self.jobs: list[Job | None] = [None] * n  # each worker's current job (None: it waits for a model)
        self.hung = [False] * n  # whether a worker's job never ends (it then never asks again)
        self.versions = [[] if self.table else scheme.initial_versions() for _ in range(n)]
        self.started = [0] * n  # jobs started per worker (pbs's slot rotation; a job's number)
        self.refresh_over = cfg.refresh_over(scheme)
        self.bound = cfg.staleness_bound(scheme)  # --abandon-late: a dropped slot past it costs a gradient
        self.wire = wire_format(cfg.wire_dtype, np.float64)  # messages as the master receives them (--wire-dtype)
        self._attempts: dict[tuple[int, int], int] = {}  # pbs: computations per (worker, model)
        self._events: list[tuple[float, int, int]] = []  # (end, worker, number) of the jobs under way
        self.abandon_late = cfg.abandons_late()
        self._cancelled: set[tuple[int, int]] = set()  # (worker, number) of the jobs abandoned
        self._stops: list[tuple[float, int]] = []  # (when, worker): abandoning workers reach their check points
        self.drop = fixed_threshold(cfg.drop_compute, scheme.name)
        self.auto = make_auto(cfg.drop_compute, scheme.name, cfg.accumulate)  # --drop-compute auto

    def first_start(self) -> float:
        """When the first jobs can start: after the pipelined schemes' warm-up gradients."""
        return 0.0 if self.table else self.cfg.compute_time * len(self.scheme.warmup_slots(0))

    def start(self, worker: int, version: int, at: float, given: float | None = None) -> None:
        """Worker starts a job at model `version` at time `at`; it got that model at `given`
        (default: `at`; earlier when warm-up gradients come first, as the MPI worker computes
        them on receiving its first model)."""
        number = self.started[worker]
        if self.table:
            attempt = self._attempts.get((worker, version), 0)
            self._attempts[(worker, version)] = attempt + 1
            slots, delay = self.scheme.fresh_slots(number, worker), self.delays.delay(worker, version, attempt)
        else:
            slots = self.scheme.job_slots(worker, version, self.versions[worker], self.refresh_over)
            delay = self.delays.delay(worker, version)
        # a worker's first job is never abandoned (pgc_mpi.core.abandon); DropCompute's jobs are dgd's
        job = Job(worker, version, slots, at, delay, self.cfg.compute_time, self.cfg.accumulate,
                  abandonable=self.abandon_late and number > 0, threshold=None if self.table else self.drop,
                  given=at if given is None else given, number=number)
        done, micro = job.kept_micro_batches(), job.micro_batches  # its micro-batches' time: some stop early
        job.until = at + job.compute_floor * done / micro + delay * done / micro
        self.jobs[worker], self.hung[worker] = job, job.until == math.inf
        heapq.heappush(self._events, (job.until, worker, number))
        self.started[worker] += 1

    def start_idle(self, version: int, at: float, given: float | None = None) -> None:
        """Every worker without a job starts one at model `version` (given to it at `given`: start)."""
        for i in range(self.scheme.n):
            if self.jobs[i] is None:
                self.start(i, version, at, given)

    def next_time(self) -> float:
        """When the next job ends or an abandoning worker stops (inf when none will)."""
        while self._events and self._events[0][1:] in self._cancelled:
            heapq.heappop(self._events)
        return min(self._events[0][0] if self._events else math.inf, self._stops[0][0] if self._stops else math.inf)

    def next_is_stop(self) -> bool:
        """Whether the next event (next_time) is an abandoning worker's stop, not a message."""
        ends = self.next_time()
        return bool(self._stops) and self._stops[0][0] == ends

    def take_stop(self) -> int:
        """The worker of the next stop: idle from now on, it asks for the newest model."""
        worker = heapq.heappop(self._stops)[1]
        self.jobs[worker] = None
        return worker

    def abandon(self, step: int, told: float) -> int:
        """--abandon-late: every busy worker computing for step `step` or earlier, told at `told`
        that it is decided, stops at its next check point, if its job has one left (a hung worker
        checks nothing), unless it is the worker's first job, and, where dropping costs a gradient
        later (a pipelined slot past the staleness bound), only at a check point that leaves more
        than one partition gradient of the job (pgc_mpi.core.abandon: Job.stop_point). Returns how
        many jobs were abandoned."""
        if not self.abandon_late:
            return 0
        abandoned = 0
        for i, job in enumerate(self.jobs):
            if job is None or job.step > step or (i, job.number) in self._cancelled:
                continue
            job.drop_costs = drop_costs_a_gradient(self.scheme, i, job.step, job.slots, self.versions[i], self.bound)
            stop = job.stop_point(told, self.cfg.compute_time)
            if stop is not None:
                self._cancelled.add((i, job.number))
                heapq.heappush(self._stops, (stop, i))
                job.until = stop
                abandoned += 1
        return abandoned

    def finish(self) -> tuple[float, Job, Message, Callable[[], np.ndarray], Callable[[], float]]:
        """End the next job: (time, the job, its message, its payload and its minibatch loss as
        callables that compute them: the collector calls them only if it uses the message)."""
        self.next_time()  # past the abandoned jobs
        at, worker, _ = heapq.heappop(self._events)
        job, self.jobs[worker] = self.jobs[worker], None
        version, delay = job.step, job.delay
        if self.table:
            slot = job.slots[0]
            part = self.scheme.placement[worker][slot]
            draw = self.scheme.draw_index(job.number, slot)
            return (at, job, Message(version, worker, (version,), partition=part, delay=delay,
                                     compute_time=self.cfg.compute_time),
                    self._on_wire(partial(self.builder.gradient, part, version, draw)),
                    partial(self.builder.loss, part, version, draw))
        for k in job.slots:
            self.versions[worker][k] = version
        done = job.kept_micro_batches()
        share = done / job.micro_batches  # of its compute and of its delay (slowness of the computation)
        msg = Message(version, worker, tuple(self.versions[worker]), delay=delay * done / job.micro_batches,
                      gradients=job.gradients,
                      compute_time=self.cfg.compute_time * job.gradients * share, computed_share=share)
        if share < 1.0:  # --drop-compute cut it short: the partial sum (pgc_mpi.core.drop_compute)
            loss_and_message = cache(partial(self.builder.dropped, worker, version, done))
            return at, job, msg, self._on_wire(lambda: loss_and_message()[1]), lambda: loss_and_message()[0]
        fresh = self.scheme.fresh_slots(version, worker)
        # the versions as they are now: the worker's list changes with its next job
        return (at, job, msg, self._on_wire(partial(self.builder.message, worker, version, list(msg.versions))),
                partial(self.builder.message_loss, worker, version, fresh))

    def decided(self, record: dict, now: float) -> None:
        """A step is decided (its `record` made) at `now`: --drop-compute auto observes it (and
        chooses the threshold once its steps are measured); with --abandon-late the workers still
        on this step or older are told with the new model, and stop (the record's `abandoned`)."""
        if self.auto is not None:
            record.update(self.auto.observe(record))
            self.drop = self.auto.chosen()
        if self.abandon_late:
            record["abandoned"] = self.abandon(record["step"], now)

    def _on_wire(self, payload: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
        """A message's payload as the master receives it: rounded to the wire format, if narrower."""
        return (lambda: self.wire.round_trip(payload())) if self.wire.narrowed else payload

    def can_refresh(self, partitions: list[int]) -> bool:
        """Whether every one of `partitions` has a holder that has not hung (pbs workers never
        stop computing, so without one the table stays stale while time runs on forever)."""
        live = [i for i in range(self.scheme.n) if not self.hung[i]]
        return all(any(j in self.scheme.placement[i] for i in live) for j in partitions)

    def oldest_version(self) -> int:
        """The oldest model a live worker's buffers or jobs still refer to (hung workers excluded:
        their buffers are never sent again and must not pin old models in memory)."""
        live = [job.step for i, job in enumerate(self.jobs)
                if job is not None and not self.hung[i] and (i, job.number) not in self._cancelled]
        if not self.table:
            live += [min(self.versions[i]) for i in range(self.scheme.n) if not self.hung[i]]
        return min(live, default=0)


def simulate(cfg: SimConfig, problem: Problem | None = None, record_params: bool = False,
             progress: Callable[[dict], None] | None = None, **yours) -> SimResult:
    """Run one scheme on `problem` under the straggler model; deterministic for a given cfg.

    The problem is evaluated after every cfg.eval_every-th step and after the last one (also
    when the run stalls or stops at its target), into result.evals. Instead of a problem, give
    your own torch model and data as pgc_mpi.fit takes them, `model=..., train_data=..., loss=...,
    test_data=..., metrics=..., collate_fn=..., batch_size=..., dtype=...` (pgc_mpi.torch_problem
    builds it for cfg.workers workers and cfg.seed)."""
    problem = _problem_of(cfg, problem, yours)
    scheme = cfg.make_scheme(cfg.workers)
    w = problem.initial_params().astype(np.float64)
    opt = make_update(cfg, w, problem)  # the recipe's built-ins, or its --optimizer / --scheduler factories
    builder = MessageBuilder(scheme, problem)
    builder.add_model(0, w)
    collector = make_collector(scheme, opt.grad, cfg.staleness_bound(scheme))
    workers = SimWorkers(scheme, cfg, builder)
    diagnostics = (TableDiagnostics(problem, cfg.probe_every, cfg.staleness_bound(scheme), cfg.adapt)
                   if isinstance(scheme, PbsScheme) else None)
    nbytes = Layout(gradient_header(buffers_per_message(scheme)), problem.dim, workers.wire.storage).nbytes
    per_message, step_parts = _master_cost(cfg, scheme.n, problem.dim)
    result = SimResult(cfg, trajectory=[w.copy()] if record_params else [])
    now, received, evaluated = 0.0, 0, False
    workers.start_idle(0, workers.first_start(), given=0.0)
    for t in range(cfg.steps):
        began = now
        collector.begin(t)
        if diagnostics is not None:
            diagnostics.remember(t, w)
        workers.start_idle(t, now)
        dec, missed, now, arrived = _collect(collector, workers, cfg, began, per_message)
        received += arrived
        if dec is None:
            result.stalled = (f"step {t}: {scheme.name} cannot decode, the workers still out never answer "
                              f"(still waiting for {collector.waits_on} {collector.waiting_for()})")
            break
        extra = {} if diagnostics is None else diagnostics.observe(t, collector.table, opt.grad, opt)
        now += sum(step_parts.values())  # the new model leaves once decoded, applied and sent
        # the record before the old models go: its loss is that of the used messages' minibatches
        record = {"step": t, "wall_time": now, "step_time": now - began,
                  **master_times({"receive": arrived * per_message, **step_parts}),
                  "bytes_received": received * nbytes, **collector.record(dec, missed), **extra,
                  "wire_error": workers.wire.decode_error(dec.weights)}
        result.records.append(record)
        workers.decided(record, now)
        record.update(opt.step())  # the recipe's lr and grad_norm, as the MPI master records them
        builder.add_model(t + 1, w)
        builder.forget_before(workers.oldest_version())
        evaluated = (t + 1) % cfg.eval_every == 0 or t == cfg.steps - 1
        metrics = _evaluate(problem, w, result, t, now) if evaluated else {}
        if record_params:
            result.trajectory.append(w.copy())
        if progress is not None:
            progress(record)
        if _reached(cfg, metrics):
            break
    if result.records and not evaluated:  # stalled between two evaluations: evaluate where it stopped
        _evaluate(problem, w, result, result.records[-1]["step"], result.records[-1]["wall_time"])
    result.params = w
    return result


def _problem_of(cfg: SimConfig, problem: Problem | None, yours: dict) -> Problem:
    """The problem simulate runs: the one given, or one built of your model and data; sampled as
    --fixed-minibatch and --accumulate ask."""
    if (problem is None) == (not yours):
        raise TypeError("simulate() takes a problem or your model and data (model=..., train_data=...), one of them")
    if problem is None:
        from ..learning.torch_problem import torch_problem

        problem = torch_problem(workers=cfg.workers, seed=cfg.seed, partitioning=cfg.partitioning, **yours)
    cut = getattr(problem, "partitioning", "iid")
    if cut != cfg.partitioning:  # the problem's partitions are cut when it is built: they cannot follow cfg
        raise ConfigError(f"--partitioning {cfg.partitioning}: the problem given was cut {cut}; build it with "
                          f"partitioning={cfg.partitioning!r} (pgc_mpi.torch_problem, load_problem), or simulate "
                          f"with partitioning={cut!r}")
    return with_sampling(problem, cfg.fixed_minibatch, cfg.accumulate)


def _master_cost(cfg: SimConfig, n: int, dim: int) -> tuple[float, dict[str, float]]:
    """(the master's seconds per message received, its seconds per step for decode, update and send)
    from --master-cost's model; none without one (the simulated master takes no time)."""
    if cfg.master_cost is None:
        return 0.0, {}
    cost = load_master_cost(cfg.master_cost)
    return cost.receive_seconds(n, dim), cost.step_seconds(n, dim)


def _evaluate(problem: Problem, w: np.ndarray, result: SimResult, step: int, at: float) -> dict[str, float]:
    """Evaluate the parameters after `step` (at simulated time `at`) into result.evals."""
    metrics = problem.evaluate(w)
    result.loss_key = loss_key(metrics)
    result.evals.append({"step": step, "wall_time": at, **metrics})
    return metrics


def _reached(cfg: SimConfig, metrics: Mapping[str, float]) -> bool:
    """Whether an evaluation's metrics reach the run's target gap, loss or accuracy (--stop-at-target)."""
    if not metrics:
        return False
    gap = cfg.target_gap is not None and metrics.get("gap", math.inf) <= cfg.target_gap
    loss = cfg.target_loss is not None and metrics.get(loss_key(metrics), math.inf) <= cfg.target_loss
    key = accuracy_key(metrics)
    accuracy = cfg.target_accuracy is not None and key is not None and metrics[key] >= cfg.target_accuracy
    return gap or loss or accuracy


def _collect(collector: CodedCollector | TableCollector, workers: SimWorkers, cfg: SimConfig,
             began: float, per_message: float) -> tuple[Decoded | None, bool, float, int]:
    """Deliver messages in time order until the step decodes: (decoded or None if it never can,
    deadline missed, the time, messages received). The master takes `per_message` seconds to
    receive each message: it cannot take in the next batch before it is done with this one."""
    deadline_at = began + cfg.deadline if cfg.deadline is not None else math.inf
    missed, now, arrived = False, began, 0
    while True:
        nxt = workers.next_time()
        if nxt > deadline_at and not missed:
            missed = True
            dec = collector.on_deadline(cfg.on_deadline)  # may raise DeadlineMissed
            if dec is not None:
                return dec, missed, deadline_at, arrived
        if nxt == math.inf or (math.isinf(deadline_at) or missed) and _hopeless(collector, workers):
            return None, missed, now, arrived
        now = max(now, nxt)
        batch, now = _deliver(collector, workers, now, per_message)
        arrived += batch
        if collector.ready():
            return collector.decode(), missed, now, arrived


def _hopeless(collector: CodedCollector | TableCollector, workers: SimWorkers) -> bool:
    """pbs: a partition the table lacks can never be refreshed (all its holders hung)."""
    return workers.table and any(workers.hung) and not workers.can_refresh(collector.waiting_for())


def _deliver(collector: CodedCollector | TableCollector, workers: SimWorkers, now: float,
             per_message: float) -> tuple[int, float]:
    """Every message that arrives at time `now` to the master (it reads them all before it
    answers, as the MPI master reads a poll's batch), then the answers: the current model at
    once for a late message (the newest-model rule) and, unless the step is now complete, for
    every pbs message; otherwise the worker waits for the next step's model (start_idle).
    A worker that abandoned its job (--abandon-late) asks for the current model when it stops,
    as a late worker does with its message. Returns how many messages arrived and when the master
    is done receiving them (`per_message` seconds each; the answers leave then)."""
    batch, stopped = [], []
    while workers.next_time() <= now:
        if workers.next_is_stop():
            stopped.append(workers.take_stop())
            continue
        at, job, msg, payload, loss = workers.finish()
        # as the MPI master measures it: from the model reaching the worker to the master taking the
        # message in (now: later than `at` when the message waited for the master)
        msg.turnaround = now - job.given
        collector.offer(msg, payload, loss)
        batch.append(msg)
    now += per_message * len(batch)
    if not collector.ready():
        for msg in batch:
            if collector.answers_every_message or msg.step < collector.step:
                workers.start(msg.worker, collector.step, now)
        for worker in stopped:
            workers.start(worker, collector.step, now)
    return len(batch), now
