"""Single-process, deterministic simulator of the parameter server, on a simulated clock.

It drives the same scheme objects and the same collectors as the MPI master, with the same
worker semantics: warm-up, slot rotation, stale buffers, decoding from the first arrivals, the
newest-model rule (a worker that finishes late has its message counted and dropped and starts
on the newest model at once), pbs's continuous computation, deadlines and --max-staleness.
A worker's job for step t takes compute_time per fresh partition gradient plus the straggler
model's delay for (worker, t); messages and the master's own work take no simulated time.

Every gradient is really computed, through the Problem protocol (a synthetic convex problem or
a torch model on a data set, models.TorchProblem), at the model version the scheme prescribes,
and only when the master uses it: a message's payload is handed to the collector as a callable
(collector.resolve), so late, over-stale and uncounted messages cost no gradient. A step record's
`train_loss` is, as in the MPI runtime, the mean minibatch loss of the messages the master used
(the "decoded" training loss); the problem itself is evaluated every `eval_every` steps and after
the last one, into separate evaluation records (SimResult.evals), as pgc-train's eval events.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, partial
from typing import TYPE_CHECKING

import numpy as np

from ..config import SimConfig
from ..core.abandon import abandon_margin, drop_costs_a_gradient, next_check_point
from ..core.collector import CodedCollector, Decoded, TableCollector, make_collector
from ..core.drop_compute import fixed_threshold, make_auto, micro_batches_done
from ..core.message import Layout, Message, buffers_per_message, gradient_header
from ..core.schemes import CodedScheme, PbsScheme
from ..core.stragglers import DelayModel
from ..core.wire import wire_format
from ..learning.diagnostics import TableDiagnostics
from ..learning.optim import FlatOptimizer, Recipe
from ..learning.problems import Problem, accuracy_key, loss_key, with_sampling
from ..runs.metrics import master_times
from .master_cost import load as load_master_cost
from .messages import MessageBuilder

if TYPE_CHECKING:
    from ..runs.checkpoint import Checkpoint


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
    """

    def __init__(self, scheme: CodedScheme | PbsScheme, cfg: SimConfig, builder: MessageBuilder):
        self.scheme, self.cfg, self.builder = scheme, cfg, builder
        self.delays = DelayModel(cfg.delay, scheme.n, seed=cfg.seed)
        self.table = isinstance(scheme, PbsScheme)
        n = scheme.n
        self.busy = [False] * n
        self.until = [0.0] * n  # when each worker's current job ends (inf: it hangs)
        self.given = [0.0] * n  # when the model of each worker's current job reached it (turnarounds start)
        self.versions = [[] if self.table else scheme.initial_versions() for _ in range(n)]
        self.count = [0] * n  # pbs: computations started per worker (its slot rotation)
        self.slots: list[tuple[int, ...]] = [()] * n  # coded: the slots each worker's current job computes
        self.refresh_over = cfg.refresh_over(scheme)
        self.bound = cfg.staleness_bound(scheme)  # --abandon-late: a dropped slot past it costs a gradient
        self.wire = wire_format(cfg.wire_dtype, np.float64)  # messages as the master receives them (--wire-dtype)
        self._attempts: dict[tuple[int, int], int] = {}  # pbs: computations per (worker, model)
        self._events: list[tuple[float, int, int, int, float]] = []  # (end, worker, version, count, delay)
        self.abandon_late = cfg.abandons_late()
        self.began = [0.0] * n  # when each worker's current job began
        self.job = [0] * n  # the version each worker's current job computes for
        self.finished = [0] * n  # jobs each worker has finished (its first is never abandoned)
        self._cancelled: set[tuple[int, int]] = set()  # (worker, count) of the jobs abandoned
        self._stops: list[tuple[float, int]] = []  # (when, worker): abandoning workers reach their check points
        self.drop = fixed_threshold(cfg.drop_compute, scheme.name)
        self.auto = make_auto(cfg.drop_compute, scheme.name, cfg.accumulate)  # --drop-compute auto
        self.done = [cfg.accumulate] * n  # --drop-compute: the micro-batches of each worker's current job

    def first_start(self) -> float:
        """When the first jobs can start: after the pipelined schemes' warm-up gradients."""
        return 0.0 if self.table else self.cfg.compute_time * len(self.scheme.warmup_slots(0))

    def start(self, worker: int, version: int, at: float, given: float | None = None) -> None:
        """Worker starts a job at model `version` at time `at`; it got that model at `given`
        (default: `at`; earlier when warm-up gradients come first, as the MPI worker computes
        them on receiving its first model)."""
        self.given[worker] = at if given is None else given
        self.began[worker], self.job[worker] = at, version
        if self.table:
            attempt = self._attempts.get((worker, version), 0)
            self._attempts[(worker, version)] = attempt + 1
            work, delay = self.cfg.compute_time, self.delays.delay(worker, version, attempt)
        else:
            catch_up = self.scheme.refresh_slots(worker, version, self.versions[worker], self.refresh_over)
            self.slots[worker] = (*catch_up, *self.scheme.fresh_slots(version, worker))
            work = self.cfg.compute_time * len(self.slots[worker])
            delay = self.delays.delay(worker, version)
            if self.drop is not None:  # the job's time is its micro-batches', and it stops some early
                micro = self.cfg.accumulate
                self.done[worker] = micro_batches_done(work + delay, micro, self.drop)
                work, delay = work * self.done[worker] / micro, delay * self.done[worker] / micro
        self.until[worker] = at + work + delay
        heapq.heappush(self._events, (self.until[worker], worker, version, self.count[worker], delay))
        self.count[worker] += 1
        self.busy[worker] = True

    def start_idle(self, version: int, at: float, given: float | None = None) -> None:
        """Every worker without a job starts one at model `version` (given to it at `given`: start)."""
        for i in range(self.scheme.n):
            if not self.busy[i]:
                self.start(i, version, at, given)

    def next_time(self) -> float:
        """When the next job ends or an abandoning worker stops (inf when none will)."""
        while self._events and (self._events[0][1], self._events[0][3]) in self._cancelled:
            heapq.heappop(self._events)
        return min(self._events[0][0] if self._events else math.inf, self._stops[0][0] if self._stops else math.inf)

    def next_is_stop(self) -> bool:
        """Whether the next event (next_time) is an abandoning worker's stop, not a message."""
        ends = self.next_time()
        return bool(self._stops) and self._stops[0][0] == ends

    def take_stop(self) -> int:
        """The worker of the next stop: idle from now on, it asks for the newest model."""
        worker = heapq.heappop(self._stops)[1]
        self.busy[worker] = False
        return worker

    def abandon(self, step: int, told: float) -> int:
        """--abandon-late: every busy worker computing for step `step` or earlier, told at `told`
        that it is decided, stops at its next check point, if its job has one left (a hung worker
        checks nothing), unless it is the worker's first job, and, where dropping costs a gradient
        later (a pipelined slot past the staleness bound), only at a check point that leaves more
        than one partition gradient of the job (pgc_mpi.core.abandon). Returns how many jobs were
        abandoned."""
        if not self.abandon_late:
            return 0
        abandoned = 0
        micro = self.cfg.accumulate
        for i in range(self.scheme.n):
            if not self.busy[i] or self.job[i] > step or self.until[i] == math.inf or not self.finished[i]:
                continue
            costs = drop_costs_a_gradient(self.scheme, i, self.job[i], self.slots[i], self.versions[i], self.bound)
            margin = abandon_margin(costs, self.cfg.compute_time)
            stop = next_check_point(self.began[i], self.until[i], micro * max(1, len(self.slots[i])), told, margin)
            if stop is not None:
                self._cancelled.add((i, self.count[i] - 1))
                heapq.heappush(self._stops, (stop, i))
                self.until[i] = stop
                abandoned += 1
        return abandoned

    def finish(self) -> tuple[float, Message, Callable[[], np.ndarray], Callable[[], float]]:
        """End the next job: (time, its message, its payload and its minibatch loss as callables
        that compute them: the collector calls them only if it uses the message)."""
        self.next_time()  # past the abandoned jobs
        at, worker, version, count, delay = heapq.heappop(self._events)
        self.busy[worker] = False
        self.finished[worker] += 1
        if self.table:
            slot = self.scheme.fresh_slots(count, worker)[0]
            part = self.scheme.placement[worker][slot]
            draw = self.scheme.draw_index(count, slot)
            return (at, Message(version, worker, (version,), partition=part, delay=delay,
                                compute_time=self.cfg.compute_time),
                    self._on_wire(partial(self.builder.gradient, part, version, draw)),
                    partial(self.builder.loss, part, version, draw))
        computed = self.slots[worker]
        for k in computed:
            self.versions[worker][k] = version
        share = self.done[worker] / self.cfg.accumulate
        msg = Message(version, worker, tuple(self.versions[worker]), delay=delay, gradients=len(computed),
                      compute_time=self.cfg.compute_time * len(computed) * share, computed_share=share)
        if share < 1.0:  # --drop-compute cut it short: the partial sum (pgc_mpi.core.drop_compute)
            loss_and_message = cache(partial(self.builder.dropped, worker, version, self.done[worker]))
            return at, msg, self._on_wire(lambda: loss_and_message()[1]), lambda: loss_and_message()[0]
        fresh = self.scheme.fresh_slots(version, worker)
        # the versions as they are now: the worker's list changes with its next job
        return (at, msg, self._on_wire(partial(self.builder.message, worker, list(msg.versions))),
                partial(self.builder.message_loss, worker, version, fresh))

    def _on_wire(self, payload: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
        """A message's payload as the master receives it: rounded to the wire format, if narrower."""
        return (lambda: self.wire.round_trip(payload())) if self.wire.narrowed else payload

    def can_refresh(self, partitions: list[int]) -> bool:
        """Whether every one of `partitions` has a holder that has not hung (pbs workers never
        stop computing, so without one the table stays stale while time runs on forever)."""
        live = [i for i in range(self.scheme.n) if self.until[i] < math.inf]
        return all(any(j in self.scheme.placement[i] for i in live) for j in partitions)

    def oldest_version(self) -> int:
        """The oldest model a live worker's buffers or jobs still refer to (hung workers excluded:
        their buffers are never sent again and must not pin old models in memory)."""
        live = [e[2] for e in self._events if e[0] < math.inf and (e[1], e[3]) not in self._cancelled]
        if not self.table:
            live += [min(self.versions[i]) for i in range(self.scheme.n) if self.until[i] < math.inf]
        return min(live, default=0)


def simulate(cfg: SimConfig, problem: Problem | None = None, record_params: bool = False,
             progress: Callable[[dict], None] | None = None, **yours) -> SimResult:
    """Run one scheme on `problem` under the straggler model; deterministic for a given cfg.

    The problem is evaluated after every cfg.eval_every-th step and after the last one (also
    when the run stalls or stops at its target), into result.evals. Instead of a problem, give
    your own torch model and data as pgc_mpi.fit takes them, `model=..., train_data=..., loss=...,
    test_data=..., metrics=..., collate_fn=..., batch_size=..., dtype=...` (pgc_mpi.torch_problem
    builds it for cfg.workers workers and cfg.seed)."""
    if (problem is None) == (not yours):
        raise TypeError("simulate() takes a problem or your model and data (model=..., train_data=...), one of them")
    if problem is None:
        from ..learning.models import torch_problem

        problem = torch_problem(workers=cfg.workers, seed=cfg.seed, **yours)
    scheme = cfg.make_scheme(cfg.workers)
    problem = with_sampling(problem, cfg.fixed_minibatch, cfg.accumulate)
    w = problem.initial_params().astype(np.float64)
    opt = FlatOptimizer(w, Recipe.of(cfg))
    builder = MessageBuilder(scheme, problem)
    builder.add_model(0, w)
    collector = make_collector(scheme, opt.grad, cfg.staleness_bound(scheme))
    workers = SimWorkers(scheme, cfg, builder)
    diagnostics = (TableDiagnostics(problem, cfg.probe_every, cfg.staleness_bound(scheme), cfg.adapt)
                   if isinstance(scheme, PbsScheme) else None)
    nbytes = Layout(gradient_header(buffers_per_message(scheme)), problem.dim, workers.wire.storage).nbytes
    cost = load_master_cost(cfg.master_cost) if cfg.master_cost is not None else None
    per_message = cost.receive_seconds(scheme.n, problem.dim) if cost else 0.0  # the master's time per message
    step_parts = cost.step_seconds(scheme.n, problem.dim) if cost else {}  # decode, update, send
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
        if workers.auto is not None:  # --drop-compute auto: the threshold once its steps are measured
            record.update(workers.auto.observe(record))
            workers.drop = workers.auto.chosen()
        if workers.abandon_late:  # told with the new model: the workers still on this step or older stop
            record["abandoned"] = workers.abandon(t, now)
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
    return workers.table and math.inf in workers.until and not workers.can_refresh(collector.waiting_for())


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
        at, msg, payload, loss = workers.finish()
        # as the MPI master measures it: from the model reaching the worker to the master taking the
        # message in (now: later than `at` when the message waited for the master)
        msg.turnaround = now - workers.given[msg.worker]
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


def replay(scheme: CodedScheme | PbsScheme, problem: Problem, steps: Iterable[dict], optimizer: str = "sgd",
           lr: float = 0.05, momentum: float = 0.9, wire_dtype: str | None = None,
           start: Checkpoint | None = None) -> list[np.ndarray]:
    """Recompute a recorded run's parameters from its arrivals and message versions.

    Each item of `steps` has 'arrivals' (worker ids in order), 'versions' ({worker: the
    versions of its message's buffers}, keys may be strings as in JSON) and optionally
    'partial', as the MPI master logs them. For pbs it has 'messages' instead (every message
    the master took in that step, in its order, as the MPI master logs them): each enters the
    table in that order and the step decodes after the last, as the master did (with the
    learning rate the record's 'lr' says, where --adapt changed it); a worker's k-th message
    since the run (or its resumption) started is its k-th computation, which fixes its partition
    and minibatch. `wire_dtype`: the run's --wire-dtype (messages are rounded to it as the
    workers rounded them). `start`: the checkpoint a resumed run started from (its parameters,
    optimizer state and pbs table; `steps` are then the records from its step on). Returns w_0,
    w_1, ... (from start.step on).
    """
    first = 0 if start is None else start.step
    w = (problem.initial_params() if start is None else start.params).astype(np.float64)
    opt = FlatOptimizer(w, optimizer, lr, momentum=momentum)
    builder = MessageBuilder(scheme, problem)
    builder.add_model(first, w)
    collector = make_collector(scheme, opt.grad, first=first)
    if start is not None:
        opt.opt.load_state_dict(start.optimizer)
        opt.opt.param_groups[0]["lr"] = lr
        if start.table_grads is not None:
            collector.table.grads[...], collector.table.versions[...] = start.table_grads, start.table_versions
    wire = wire_format(wire_dtype, np.float64)
    counts = [0] * scheme.n  # pbs: each worker's computations so far
    out = [w.copy()]
    for t, rec in enumerate(steps, start=first):
        collector.begin(t)
        if isinstance(scheme, PbsScheme):
            for message in rec["messages"]:
                worker, version, verdict = int(message[0]), int(message[1]), message[5]
                count, counts[worker] = counts[worker], counts[worker] + 1
                if verdict != "rejected":
                    slot = scheme.fresh_slots(count, worker)[0]
                    part = scheme.placement[worker][slot]
                    grad = builder.gradient(part, version, scheme.draw_index(count, slot))
                    collector.offer(Message(version, worker, (version,), partition=part), wire.round_trip(grad))
        else:
            versions = {int(k): v for k, v in rec["versions"].items()}
            for i in map(int, rec["arrivals"]):
                collector.offer(Message(t, i, tuple(versions[i])), wire.round_trip(builder.message(i, versions[i])))
        collector.decode(partial=rec.get("partial", False))
        if "lr" in rec:  # the rate the step used (a schedule's, or --adapt's change; older records: only the latter)
            opt.opt.param_groups[0]["lr"] = rec["lr"]
        opt.step()
        builder.add_model(t + 1, w)
        out.append(w.copy())
    return out
