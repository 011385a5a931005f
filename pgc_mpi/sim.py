"""Single-process, deterministic simulator of the parameter server, on a simulated clock.

It drives the same scheme objects and the same StepCollector as the MPI runtime, with the same
worker semantics: warm-up, slot rotation, stale buffers, decoding from the first arrivals, the
newest-model rule (a worker that finishes late discards nothing but its late message and starts
on the newest model), and late messages counted and dropped. A worker's job for step t takes
compute_time per fresh partition gradient plus the straggler model's delay for (worker, t);
messages and the master's own work take no simulated time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from .collector import Decoded, StepCollector, check_deadline
from .errors import ConfigError
from .optim import FlatOptimizer
from .problems import Problem
from .schemes import CodedScheme, PbsScheme, make_scheme
from .stragglers import DelayModel


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. compute_time is the simulated seconds of one partition gradient."""

    scheme: str = "pgc-cr"
    n: int = 12
    s: int = 1
    c: int | None = None
    steps: int = 100
    lr: float = 0.05
    optimizer: str = "sgd"
    delay: str = "none"
    compute_time: float = 1.0
    deadline: float | None = None
    on_deadline: str = "wait"
    max_staleness: int | None = None
    target_gap: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if not self.compute_time > 0:
            raise ConfigError(f"compute_time must be > 0, got {self.compute_time}")
        check_deadline(self.deadline, self.on_deadline)


@dataclass
class SimResult:
    """Per-step records, the final parameters and, if asked for, every step's parameters."""

    config: SimConfig
    records: list[dict] = field(default_factory=list)
    params: np.ndarray | None = None
    trajectory: list[np.ndarray] = field(default_factory=list)
    stalled: str | None = None

    def first_below(self, key: str, threshold: float) -> dict | None:
        """The first record whose `key` is <= threshold (None if never)."""
        return next((r for r in self.records if r.get(key, math.inf) <= threshold), None)

    def median_step_time(self) -> float:
        """Median simulated time per step."""
        return float(np.median([r["step_time"] for r in self.records])) if self.records else math.nan


class MessageBuilder:
    """Builds a worker's coded message from its buffers' versions, as the worker would have.

    A buffer of version v for slot k is the gradient of partition placement[i][k] at the model
    of step max(v, 0) on minibatch draw_index(v, k). Gradients are cached by (partition,
    version, draw) because the c holders of a partition often compute the very same one.
    """

    def __init__(self, scheme: CodedScheme | PbsScheme, problem: Problem):
        self.scheme, self.problem = scheme, problem
        self.models: dict[int, np.ndarray] = {}
        self._cache: dict[tuple[int, int, int], np.ndarray] = {}

    def add_model(self, version: int, w: np.ndarray) -> None:
        self.models[version] = w.copy()

    def gradient(self, partition: int, version: int, draw: int) -> np.ndarray:
        key = (partition, version, draw)
        if key not in self._cache:
            self._cache[key] = self.problem.grad(self.models[max(version, 0)], partition, draw)
        return self._cache[key]

    def message(self, worker: int, versions: list[int]) -> np.ndarray:
        coef = self.scheme.coefficients(worker)
        parts = self.scheme.placement[worker]
        out = np.zeros(self.problem.dim)
        for k, v in enumerate(versions):
            out += coef[k] * self.gradient(parts[k], v, self.scheme.draw_index(v, k))
        return out

    def forget_before(self, version: int) -> None:
        """Drop models and gradients older than `version` (no buffer refers to them any more)."""
        for v in [v for v in self.models if v < version]:
            del self.models[v]
        for key in [k for k in self._cache if k[1] < version]:
            del self._cache[key]


def _apply(opt: FlatOptimizer, builder: MessageBuilder, collector: StepCollector, dec: Decoded) -> None:
    g = opt.grad
    g[:] = 0.0
    for i in dec.used:
        g += dec.weights[i] * builder.message(i, collector.versions[i])
    opt.step()


def simulate(cfg: SimConfig, problem: Problem, record_params: bool = False,
             progress: Callable[[dict], None] | None = None) -> SimResult:
    """Run one scheme on `problem` under the straggler model; deterministic for a given cfg."""
    scheme = make_scheme(cfg.scheme, cfg.n, cfg.s, seed=cfg.seed, c=cfg.c)
    if isinstance(scheme, PbsScheme):
        return _simulate_pbs(cfg, scheme, problem, record_params, progress)
    delays = DelayModel(cfg.delay, cfg.n, seed=cfg.seed)
    w = problem.initial_params().astype(np.float64)
    opt = FlatOptimizer(w, cfg.optimizer, cfg.lr)
    builder = MessageBuilder(scheme, problem)
    builder.add_model(0, w)
    collector = StepCollector(scheme, cfg.max_staleness)
    result = SimResult(cfg, trajectory=[w.copy()] if record_params else [])

    versions = [scheme.initial_versions() for _ in range(cfg.n)]
    events: list[tuple[float, int, int]] = []  # (finish time, worker, step computed for)
    busy = [False] * cfg.n
    until = [0.0] * cfg.n  # when each worker's current job ends (inf: it hangs)
    warmup = cfg.compute_time * len(scheme.warmup_slots(0))
    now = 0.0

    def start(worker: int, step: int, at: float) -> None:
        work = cfg.compute_time * len(scheme.fresh_slots(step, worker))
        until[worker] = at + work + delays.delay(worker, step)
        heapq.heappush(events, (until[worker], worker, step))
        busy[worker] = True

    def finish() -> tuple[float, int, int]:
        at, worker, step = heapq.heappop(events)
        busy[worker] = False
        for k in scheme.fresh_slots(step, worker):
            versions[worker][k] = step
        return at, worker, step

    for i in range(cfg.n):
        start(i, 0, warmup)
    for t in range(cfg.steps):
        collector.begin(t)
        began = now
        for i in range(cfg.n):
            if not busy[i] and t > 0:
                start(i, t, now)
        deadline_at = began + cfg.deadline if cfg.deadline is not None else math.inf
        missed = False
        dec: Decoded | None = None
        while dec is None:
            nxt = events[0][0] if events else math.inf
            if nxt > deadline_at and not missed:
                missed = True
                dec = collector.on_deadline(cfg.on_deadline)  # may raise DeadlineMissed
                if dec is not None:
                    now = deadline_at
                    break
            if nxt == math.inf:
                result.stalled = (f"step {t}: {scheme.name} cannot decode, the workers still out "
                                  f"never answer (arrived: {collector.arrived})")
                result.params = w
                return result
            now, i, step = finish()
            if collector.offer(i, step, list(versions[i])) == "late":
                start(i, t, now)  # the newest-model rule: straight on to the current step
            if collector.ready():
                while events and events[0][0] <= now:  # simultaneous arrivals all count
                    _, j, sj = finish()
                    if collector.offer(j, sj, list(versions[j])) == "late":
                        start(j, t, now)
                dec = collector.decode()
        _apply(opt, builder, collector, dec)
        builder.add_model(t + 1, w)
        # a hung worker's buffers are never sent again: they must not pin old models in memory
        builder.forget_before(min(min(versions[i]) for i in range(cfg.n) if until[i] < math.inf))
        record = {
            "step": t, "time": now, "step_time": now - began, **problem.evaluate(w),
            "arrivals": list(collector.arrived), "used": dec.used, "late": collector.late,
            "rejected": list(collector.rejected), "max_staleness": dec.max_staleness,
            "deadline_missed": missed, "partial": dec.partial, "residual": dec.residual,
            "versions": dict(collector.versions),
        }
        _finish_step(result, record, w, record_params, progress)
        if cfg.target_gap is not None and record.get("gap", math.inf) <= cfg.target_gap:
            break
    result.params = w
    return result


def _finish_step(result: SimResult, record: dict, w: np.ndarray, record_params: bool,
                 progress: Callable[[dict], None] | None) -> None:
    result.records.append(record)
    if record_params:
        result.trajectory.append(w.copy())
    if progress is not None:
        progress(record)


def _simulate_pbs(cfg: SimConfig, scheme: PbsScheme, problem: Problem, record_params: bool,
                  progress: Callable[[dict], None] | None) -> SimResult:
    """pbs: workers compute continuously; the master steps on an arrival that makes the table fresh."""
    delays = DelayModel(cfg.delay, cfg.n, seed=cfg.seed)
    w = problem.initial_params().astype(np.float64)
    opt = FlatOptimizer(w, cfg.optimizer, cfg.lr)
    builder = MessageBuilder(scheme, problem)
    builder.add_model(0, w)
    table = scheme.new_table(problem.dim)
    result = SimResult(cfg, trajectory=[w.copy()] if record_params else [])
    count = [0] * cfg.n
    attempts: dict[tuple[int, int], int] = {}
    events: list[tuple[float, int, int, int]] = []  # (finish, worker, version, count)

    def start(worker: int, version: int, at: float) -> None:
        attempt = attempts.get((worker, version), 0)
        attempts[(worker, version)] = attempt + 1
        took = cfg.compute_time + delays.delay(worker, version, attempt)
        heapq.heappush(events, (at + took, worker, version, count[worker]))
        count[worker] += 1

    for i in range(cfg.n):
        start(i, 0, 0.0)
    t, began, arrivals = 0, 0.0, []
    while t < cfg.steps:
        if not events or events[0][0] == math.inf:
            result.stalled = f"step {t}: pbs table never covers partitions {table.missing(t)}"
            break
        now, i, version, k = heapq.heappop(events)
        slot = scheme.fresh_slots(k, i)[0]
        part = scheme.placement[i][slot]
        table.offer(part, version, builder.gradient(part, version, scheme.draw_index(k, slot)))
        arrivals.append(i)
        start(i, t, now)
        if not table.ready(t):
            continue
        ages = table.ages(t)
        table.mean(out=opt.grad)
        opt.step()
        record = {
            "step": t, "time": now, "step_time": now - began, **problem.evaluate(w),
            "arrivals": arrivals, "used": arrivals, "late": 0, "rejected": [],
            "max_staleness": int(ages.max()), "deadline_missed": False, "residual": 0.0,
        }
        _finish_step(result, record, w, record_params, progress)
        t, began, arrivals = t + 1, now, []
        builder.add_model(t, w)
        builder.forget_before(min([int(table.versions.min())] + [e[2] for e in events if e[0] < math.inf]))
        if cfg.target_gap is not None and record.get("gap", math.inf) <= cfg.target_gap:
            break
    result.params = w
    return result


def replay(scheme: CodedScheme, problem: Problem, steps: Iterable[dict], optimizer: str = "sgd",
           lr: float = 0.05) -> list[np.ndarray]:
    """Recompute a recorded run's parameters from its arrivals and message versions.

    Each item of `steps` has 'arrivals' (worker ids in order), 'versions' ({worker: the
    versions of its message's buffers}, keys may be strings as in JSON) and optionally
    'partial', as the MPI master logs them. Returns w_0, w_1, ...
    """
    w = problem.initial_params().astype(np.float64)
    opt = FlatOptimizer(w, optimizer, lr)
    builder = MessageBuilder(scheme, problem)
    builder.add_model(0, w)
    collector = StepCollector(scheme)
    out = [w.copy()]
    for t, rec in enumerate(steps):
        collector.begin(t)
        versions = {int(k): v for k, v in rec["versions"].items()}
        for i in rec["arrivals"]:
            collector.offer(int(i), t, versions[int(i)])
        _apply(opt, builder, collector, collector.decode(partial=rec.get("partial", False)))
        builder.add_model(t + 1, w)
        out.append(w.copy())
    return out
