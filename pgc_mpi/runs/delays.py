"""What each worker took beyond its computation, per message, measured from a run's records.

Every message the master takes in carries its turnaround (MessageRecord.turnaround: seconds from
the master's send of the model the message was computed at to the master taking the message
in) and the compute time the worker reports, so

    extra = turnaround - compute_time

is what the worker took beyond its computation: the injected delay (`--delay`), the model's and
the message's way over the network, and any hold-up (a busy node, a master still busy with
earlier messages). On a real cluster, where nothing is injected, it is the delay a simulation of
that cluster needs. In the simulator (pgc-sim, pgc-bench's sim backend) the turnaround is
simulated: there extra is the injected delay, plus any wait for a master given `--master-cost`.

Only messages past a warm-up are used: a message computed at a model of the run's first
`warmup` steps (default WARMUP) is dropped, since the first steps carry start-up effects (the
pipelined schemes' warm-up gradients, first-touch memory, imports and caches). Rejected
messages, and records without a turnaround (written before it existed, or by ddp), count for
nothing.

`measure(run)` summarizes the extras: per worker (count, mean, median, p90, p99), overall (the
same, with the spread and the tail), a persistently slow worker test, correlation in time, and a
`--delay` spec fitted to them. The rules:

- persistently slow: a worker whose median extra is at least SLOW_RATIO times the median of the
  other workers' extras (pooled) and at least SLOW_FLOOR seconds above it (below that, the
  difference is communication noise); its slowness is the difference of the two medians;
- correlation in time: each worker's extras in step order, centred on its own mean; the pooled
  lag-1 autocorrelation (sum of lag-1 products over the sum of squares, over all workers) counts
  as correlated when above 2/sqrt(pairs), twice its standard error were the extras independent;
- the fit (`fit_delay`): the slow workers become one `fixed:W1,W2:SEC` term per distinct
  slowness (SEC: their slowness, rounded), taken off their extras (clipped at 0); the pooled
  rest is fitted by maximum likelihood with an exponential and with `lognormal:MEAN:SIGMA`
  (SIGMA: the spread of the logs; only when all extras are > 0), and the family with the lower
  AIC (2 parameters - 2 log-likelihood) is the spec's base term; `none` when every extra is 0.
  The exponential is `exp:MEAN` (MEAN: the mean), or `shiftexp:SHIFT:MEAN` when the smallest of
  the n extras is too large for an exponential (n min/mean > ln 100: 1 % likely under one;
  SHIFT: the minimum less (mean - minimum)/(n-1), its unbiased estimate; MEAN: the mean minus
  SHIFT). The fit
  draws delays independently per (worker, step): a correlated run is reproduced by its trace
  (`write_trace`), not by the fitted model.

The trace (`write_trace`) holds one extra per (worker, step) in the CSV that `--delay
trace:FILE.csv` replays (pbs: the mean of a worker's messages at one model; negative extras,
clock noise, as 0). Pure: no MPI, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.message import MessageRecord
from ..core.stragglers import write_trace as write_trace_rows
from ..errors import ConfigError
from .metrics import read_metrics
from .results import read_steps

WARMUP = 5  # steps dropped at the start: their messages carry start-up effects
SLOW_RATIO = 2.0  # a persistently slow worker's median extra is at least this many times the others'
SLOW_FLOOR = 1e-3  # ...and at least this many seconds above it


@dataclass(frozen=True)
class Extra:
    """One message's extra: what its worker took beyond its computation, in seconds."""

    worker: int
    step: int  # the model version the message was computed at
    extra: float  # turnaround - compute_time
    delay: float  # the injected delay the worker reports (nan: unknown)


@dataclass(frozen=True)
class Spread:
    """Count, mean and quantiles of some extras (nan without any)."""

    count: int
    mean: float
    median: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of `values`."""
        if len(values) == 0:
            return cls(0, math.nan, math.nan, math.nan, math.nan)
        x = np.asarray(values, dtype=np.float64)
        median, p90, p99 = np.quantile(x, (0.5, 0.9, 0.99)).tolist()
        return cls(len(x), float(x.mean()), median, p90, p99)


@dataclass(frozen=True)
class WorkerExtra:
    """One worker's extras: their spread, its median over the others', slow or not, lag-1 autocorrelation."""

    worker: int
    spread: Spread
    ratio: float  # its median extra over the median of the other workers' extras
    slow: bool  # persistently slow (see the module's rule)
    lag1: float  # lag-1 autocorrelation of its extras in step order (nan: under 3, or all equal)


@dataclass(frozen=True)
class DelayFit:
    """A `--delay` spec fitted to extras: its slow workers' fixed terms plus one base family."""

    spec: str
    family: str  # the base term's family: exp, shiftexp, lognormal or none
    mean: float = 0.0  # the base term's mean delay in seconds (shiftexp: SHIFT + MEAN)
    aic: dict[str, float] = field(default_factory=dict)  # each candidate family's AIC (lower: better)


@dataclass(frozen=True)
class DelayReport:
    """The extras of a run's messages past its warm-up, summarized (see the module's docstring)."""

    warmup: int
    first_step: int  # the first model version counted (the run's first step + warmup)
    overall: Spread
    std: float
    max: float
    tail: float  # p99 over the mean: an exponential's is ln 100 = 4.6, heavier tails' more
    injected_mean: float  # the mean injected delay the workers report (nan: unknown)
    workers: tuple[WorkerExtra, ...]
    slow: dict[int, float]  # persistently slow workers: seconds their median extra is above the others'
    lag1: float  # pooled lag-1 autocorrelation over the workers
    lag1_threshold: float  # 2/sqrt(pairs): above it, the extras are correlated in time
    fit: DelayFit
    extras: tuple[Extra, ...] = field(repr=False, default=())

    @property
    def correlated(self) -> bool:
        """Whether the extras are correlated in time (pooled lag-1 over its threshold)."""
        return self.lag1 > self.lag1_threshold

    def describe(self) -> str:
        """The report as a few lines of text."""
        o = self.overall
        lines = [f"{o.count} messages from model {self.first_step} on (the first {self.warmup} steps left out): "
                 f"extra beyond the computation mean {o.mean:.4g} s, median {o.median:.4g}, p90 {o.p90:.4g}, "
                 f"p99 {o.p99:.4g}, max {self.max:.4g}, sd {self.std:.4g}, p99/mean {self.tail:.3g}"
                 + (f"; injected delay mean {self.injected_mean:.4g} s" if not math.isnan(self.injected_mean)
                    else "")]
        for w in self.workers:
            s = w.spread
            lines.append(f"  worker {w.worker}: {s.count} messages, mean {s.mean:.4g} s, median {s.median:.4g}, "
                         f"p90 {s.p90:.4g}, p99 {s.p99:.4g}, x{w.ratio:.3g} the others' median, lag-1 {w.lag1:.2f}"
                         + (" (persistently slow)" if w.slow else ""))
        lines.append(f"lag-1 autocorrelation {self.lag1:.3f} (threshold {self.lag1_threshold:.3f}): "
                     + ("correlated in time" if self.correlated else "no correlation in time"))
        lines.append(f"fitted delay model: --delay {self.fit.spec}")
        return "\n".join(lines)


def load_steps(path: Path, scheme: str | None = None, seed: int | None = None) -> list[dict]:
    """The step records of a run: a run folder (pgc-train's, or pgc-bench's sim backend's), or a
    `pgc-sim --out` file, of which the records of one scheme and seed (`scheme` and `seed` must
    say which when it holds several)."""
    path = Path(path)
    if path.is_dir():
        if not (path / "metrics.jsonl").is_file():
            raise ConfigError(f"{path}: not a run folder (no metrics.jsonl)")
        return read_steps(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such run folder or pgc-sim --out file")
    records = read_metrics(path)  # a damaged line: skipped, with a warning
    records = [r for r in records if "event" not in r and (scheme is None or r.get("scheme") == scheme)
               and (seed is None or r.get("seed") == seed)]
    runs = sorted({(str(r.get("scheme")), r.get("seed")) for r in records})
    if len(runs) > 1:
        raise ConfigError(f"{path} holds {len(runs)} runs ({', '.join(f'{s} seed {k}' for s, k in runs)}): "
                          f"name the scheme and seed")
    return records


def extras(steps: Iterable[dict], warmup: int = WARMUP) -> list[Extra]:
    """The extras of the messages in `steps` (step records, in order) computed at a model past the
    first record's step + `warmup`, in the order the master took them in. Rejected messages and
    those without a turnaround (older records, ddp) are left out."""
    out: list[Extra] = []
    first = None
    for record in steps:
        if first is None:
            first = int(record["step"])
        for m in map(MessageRecord._make, record.get("messages", [])):
            if m.verdict == "rejected" or m.step < first + warmup:
                continue
            turnaround, compute = _number(m.turnaround), _number(m.compute_time)
            if math.isfinite(turnaround) and math.isfinite(compute):
                out.append(Extra(int(m.worker), int(m.step), turnaround - compute, _number(m.delay)))
    return out


def _number(value: float | None) -> float:
    """A record's time as a float: None (JSON's NaN or infinity) as nan."""
    return math.nan if value is None else float(value)


def measure(path: Path, warmup: int = WARMUP, scheme: str | None = None, seed: int | None = None) -> DelayReport:
    """The extras of a run (a run folder or a pgc-sim --out file: load_steps), summarized and fitted."""
    steps = load_steps(path, scheme, seed)
    if not steps:
        raise ConfigError(f"{path}: no step records")
    return summarize(extras(steps, warmup), warmup, int(steps[0]["step"]) + warmup, where=str(path))


def summarize(found: Sequence[Extra], warmup: int = WARMUP, first_step: int = WARMUP,
              where: str = "the records") -> DelayReport:
    """Summarize extras (from `extras`) as the module's docstring says; ConfigError without any."""
    if not found:
        raise ConfigError(f"{where}: no message past the first {warmup} steps has a turnaround (records written "
                          f"before pgc-mpi recorded it, ddp, or a run too short)")
    x = np.array([e.extra for e in found])
    by_worker = extras_by_worker(found)
    medians = {w: float(np.median(v)) for w, v in by_worker.items()}
    workers, slow = [], {}
    for w, values in by_worker.items():
        others = np.concatenate([v for k, v in by_worker.items() if k != w]) if len(by_worker) > 1 else values
        typical = float(np.median(others))
        ratio = medians[w] / typical if typical > 0 else (math.inf if medians[w] > 0 else 1.0)
        is_slow = ratio >= SLOW_RATIO and medians[w] - typical >= SLOW_FLOOR
        if is_slow:
            slow[w] = medians[w] - typical
        workers.append(WorkerExtra(w, Spread.of(values), ratio, is_slow, _lag1(values)[0]))
    num = den = 0.0
    pairs = 0
    for values in by_worker.values():
        _, n, d, p = _lag1(values)
        num, den, pairs = num + n, den + d, pairs + p
    delays = [e.delay for e in found if math.isfinite(e.delay)]
    overall = Spread.of(x)
    return DelayReport(
        warmup=warmup, first_step=first_step, overall=overall, std=float(x.std()), max=float(x.max()),
        tail=overall.p99 / overall.mean if overall.mean > 0 else math.nan,
        injected_mean=float(np.mean(delays)) if delays else math.nan, workers=tuple(workers), slow=slow,
        lag1=num / den if den > 0 else math.nan, lag1_threshold=2 / math.sqrt(pairs) if pairs else math.nan,
        fit=fit_delay(found, slow), extras=tuple(found))


def extras_by_worker(found: Sequence[Extra]) -> dict[int, np.ndarray]:
    """Each worker's extras in step order (a worker's messages at one step: in arrival order)."""
    rows: dict[int, list[tuple[int, int, float]]] = {}
    for i, e in enumerate(found):
        rows.setdefault(e.worker, []).append((e.step, i, e.extra))
    return {w: np.array([r[2] for r in sorted(v)]) for w, v in sorted(rows.items())}


def _lag1(values: np.ndarray) -> tuple[float, float, float, int]:
    """(lag-1 autocorrelation, its numerator, its denominator, pairs) of a series centred on its mean;
    (nan, 0, 0, 0) for fewer than 3 values."""
    if len(values) < 3:
        return math.nan, 0.0, 0.0, 0
    d = values - values.mean()
    num, den = float(np.dot(d[:-1], d[1:])), float(np.dot(d, d))
    return (num / den if den > 0 else math.nan), num, den, len(values) - 1


def fit_delay(found: Sequence[Extra], slow: dict[int, float] | None = None) -> DelayFit:
    """A `--delay` spec for extras: `slow` workers' fixed terms ({worker: seconds}, as
    `summarize` finds them) plus the base family of lowest AIC among exp, shiftexp and lognormal,
    fitted by maximum likelihood to the rest (the module's docstring states the rule)."""
    slow = slow or {}
    terms = []
    groups: dict[str, list[int]] = {}
    for w, sec in sorted(slow.items()):
        groups.setdefault(_g(sec), []).append(w)
    for sec, ws in groups.items():
        terms.append(f"fixed:{','.join(map(str, ws))}:{sec}")
    x = np.array([max(0.0, e.extra - float(_g(slow[e.worker])) if e.worker in slow else e.extra) for e in found])
    family, base, mean, aic = _base(x)
    if base != "none" or not terms:
        terms.append(base)
    return DelayFit("+".join(terms), family, mean, aic)


def _g(seconds: float) -> str:
    """Seconds as a spec writes them: 4 significant digits (a fit is no more exact)."""
    return f"{seconds:.4g}"


def _base(x: np.ndarray) -> tuple[str, str, float, dict[str, float]]:
    """(family, spec term, its mean, every candidate's AIC) of the maximum-likelihood fit of lowest AIC."""
    n = len(x)
    mean = float(x.mean()) if n else 0.0
    if n == 0 or mean <= 0:
        return "none", "none", 0.0, {}
    low = float(x.min())
    # An exponential's log-likelihood at mean m is -n (ln m + 1). Its shift is not chosen by AIC:
    # a shift at the minimum always gains likelihood (a boundary parameter), and would win for
    # plain exponential data one time in seven; a minimum beyond chance says there is one.
    if n > 1 and n * low / mean > math.log(100):
        shift = low - (mean - low) / (n - 1)  # the minimum overshoots the shift by the rest's mean / n
        rest = mean - shift
        candidates = {"shiftexp": (2 * 2 + 2 * n * (math.log(rest) + 1), f"shiftexp:{_g(shift)}:{_g(rest)}", mean)}
    else:
        candidates = {"exp": (2 * 1 + 2 * n * (math.log(mean) + 1), f"exp:{_g(mean)}", mean)}
    if low > 0:  # log-normal: the logs' mean mu and spread sigma; its mean is exp(mu + sigma^2 / 2)
        logs = np.log(x)
        mu, sigma = float(logs.mean()), float(logs.std())
        if sigma > 0:
            loglik = -float(logs.sum()) - n * math.log(sigma * math.sqrt(2 * math.pi)) - n / 2
            fitted = math.exp(mu + sigma * sigma / 2)
            candidates["lognormal"] = (2 * 2 - 2 * loglik, f"lognormal:{_g(fitted)}:{_g(sigma)}", fitted)
    family = min(candidates, key=lambda k: candidates[k][0])
    return family, candidates[family][1], candidates[family][2], {k: v[0] for k, v in candidates.items()}


def write_trace(found: Iterable[Extra], path: Path, rebase: bool = False) -> int:
    """Write extras as a trace CSV (worker,step,delay) that `--delay trace:PATH` replays: one
    row per (worker, step), the mean of a worker's messages at one model (pbs), negative extras
    (clock noise) as 0. `rebase`: number the steps from 0 (the first step measured replays at a
    run's first step) instead of the run's own steps (a replay of the same run then has no delay
    in its warm-up steps, which the extras leave out). Returns the rows written."""
    cells: dict[tuple[int, int], list[float]] = {}
    for e in found:
        cells.setdefault((e.worker, e.step), []).append(e.extra)
    first = min((step for _, step in cells), default=0) if rebase else 0
    rows = [(w, s - first, max(0.0, float(np.mean(v)))) for (w, s), v in sorted(cells.items())]
    write_trace_rows(Path(path), rows)
    return len(rows)
