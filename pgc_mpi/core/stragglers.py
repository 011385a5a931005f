"""Straggler injection: seeded extra delays per (worker, step), parsed from a short spec.

Specs (combine several with '+', their delays add up; all times in seconds):
  none                     no injected delay
  exp:MEAN                 every worker, every step: exponential with that mean (the paper's model)
  shiftexp:SHIFT:MEAN      SHIFT plus an exponential with mean MEAN
  lognormal:MEAN:SIGMA     log-normal with that mean; SIGMA is the underlying normal's spread
  pareto:SCALE:ALPHA       heavy tail: SCALE times a Lomax (Pareto II) draw with shape ALPHA
  bimodal:MEAN:P:LOW:HIGH  log-normal jitter (mean MEAN, sigma 0.5) plus, with probability P,
                           an extra uniform LOW..HIGH stall ("occasional 10-30 s stragglers")
  markov:PS:PF:SEC         bursty: each worker is a two-state chain (fast -> slow with
                           probability PS per step, slow -> fast with PF); slow steps add SEC
  fixed:W1,W2:SEC          those workers are always SEC slower
  persistent:K:SEC         K workers drawn once from the seed are always SEC slower (a
                           heterogeneous cluster)
  random:K:SEC             K workers drawn afresh every step are SEC slower
  hang:W@STEP              worker W stops responding from that step on (an infinite delay)
  trace:FILE.csv           replay delays from a CSV with columns worker,step,delay (missing
                           entries are 0), e.g. measured on your own cluster or exported from a run
Worker ids are 0..n-1 (MPI rank minus one). The same (seed, worker, step) always gives the
same delay, whatever order the delays are asked for in, so runs replay exactly.
"""

from __future__ import annotations

import csv
import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError

HANG = math.inf
USAGE = ("use none, exp:MEAN, shiftexp:SHIFT:MEAN, lognormal:MEAN:SIGMA, pareto:SCALE:ALPHA, "
         "bimodal:MEAN:P:LOW:HIGH, markov:PS:PF:SEC, fixed:W1,W2:SEC, persistent:K:SEC, random:K:SEC, "
         "hang:W@STEP or trace:FILE.csv, joined with '+'")


@dataclass(frozen=True)
class _Term:
    kind: str
    values: tuple[float, ...] = ()
    workers: tuple[int, ...] = ()
    table: Trace | None = field(default=None, compare=False)


class DelayModel:
    """Extra seconds a worker spends on a step, on top of its compute time."""

    def __init__(self, spec: str, n: int, seed: int = 0):
        self.spec, self.n, self.seed = spec, n, seed
        terms = [_parse_term(part.strip(), n, spec) for part in spec.split("+")]
        self._terms = [t for t in terms if t.kind != "none"]
        self._chains: dict[tuple[int, int], list[bool]] = {}  # (term, worker) -> slow state per step

    def delay(self, worker: int, step: int, attempt: int = 0) -> float:
        """Injected delay of `worker` at `step` in seconds (math.inf: the worker hangs).

        `attempt` tells apart several computations of one worker at one step (pbs workers
        compute as often as they can, on whatever model is newest).
        """
        total = 0.0
        for index, term in enumerate(self._terms):
            d = self._term_delay(index, term, worker, step, attempt)
            if d == HANG:
                return HANG
            total += d
        return total

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *key])

    def _term_delay(self, index: int, term: _Term, worker: int, step: int, attempt: int) -> float:
        kind, v = term.kind, term.values
        if kind in ("exp", "shiftexp", "lognormal", "pareto", "bimodal"):
            rng = self._rng(index, worker, step, attempt, 1)
            if kind == "exp":
                return float(rng.exponential(v[0]))
            if kind == "shiftexp":
                return v[0] + float(rng.exponential(v[1]))
            if kind == "lognormal":
                return _lognormal(rng, v[0], v[1])
            if kind == "pareto":
                return v[0] * float(rng.pareto(v[1]))
            jitter = _lognormal(rng, v[0], 0.5)
            return jitter + (float(rng.uniform(v[2], v[3])) if rng.random() < v[1] else 0.0)
        if kind == "markov":
            return v[2] if self._slow(index, term, worker, step) else 0.0
        if kind == "fixed":
            return v[0] if worker in term.workers else 0.0
        if kind == "persistent":
            chosen = self._rng(index, 3).choice(self.n, size=int(v[0]), replace=False)
            return v[1] if worker in chosen else 0.0
        if kind == "random":
            chosen = self._rng(index, step, 2).choice(self.n, size=int(v[0]), replace=False)
            return v[1] if worker in chosen else 0.0
        if kind == "hang":
            return HANG if worker in term.workers and step >= v[0] else 0.0
        return term.table.get(worker, step)  # trace

    def _slow(self, index: int, term: _Term, worker: int, step: int) -> bool:
        """State of the worker's two-state chain at `step` (computed from step 0, memoized)."""
        chain = self._chains.setdefault((index, worker), [])
        while len(chain) <= step:
            prev = chain[-1] if chain else False
            u = float(self._rng(index, worker, len(chain), 4).random())
            chain.append(u >= term.values[1] if prev else u < term.values[0])
        return chain[step]

    def hangs(self) -> dict[int, int]:
        """{worker: first step at which it hangs} for every hang term."""
        return {t.workers[0]: int(t.values[0]) for t in self._terms if t.kind == "hang"}

    @property
    def active(self) -> bool:
        """Whether the model injects anything at all."""
        return bool(self._terms)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float) -> float:
    if mean == 0:
        return 0.0
    return float(rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma))


def _number(text: str, what: str, spec: str, low: float = 0.0, high: float = math.inf) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--delay {spec!r}: {what} must be a number, got {text!r}") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"--delay {spec!r}: {what} must be a finite number in [{low:g}, {high:g}], got {text!r}")
    return value


def _worker(text: str, n: int, spec: str) -> int:
    try:
        w = int(text)
    except ValueError:
        raise ConfigError(f"--delay {spec!r}: worker id must be an integer, got {text!r}") from None
    if not 0 <= w < n:
        raise ConfigError(f"--delay {spec!r}: worker id {w} is outside 0..{n - 1} "
                          f"(worker id = rank - 1, or rank - K with --servers K)")
    return w


def _count(text: str, n: int, spec: str) -> float:
    if not text.isdigit() or not 0 < int(text) <= n:
        raise ConfigError(f"--delay {spec!r}: K must be an integer in 1..{n} (the number of workers)")
    return float(text)


_ARITY = {"exp": 1, "shiftexp": 2, "lognormal": 2, "pareto": 2, "bimodal": 4, "markov": 3}


def _parse_term(term: str, n: int, spec: str) -> _Term:
    kind, _, rest = term.partition(":")
    parts = rest.split(":") if rest else []
    if kind == "none" and not rest:
        return _Term("none")
    if kind in _ARITY and len(parts) == _ARITY[kind]:
        names = {"exp": ["the mean"], "shiftexp": ["the shift", "the mean"], "lognormal": ["the mean", "SIGMA"],
                 "pareto": ["the scale", "ALPHA"], "bimodal": ["the mean", "P", "LOW", "HIGH"],
                 "markov": ["PS", "PF", "the delay"]}[kind]
        values = tuple(_number(p, name, spec) for p, name in zip(parts, names))
        if kind == "pareto" and values[1] <= 0:
            raise ConfigError(f"--delay {spec!r}: ALPHA must be > 0")
        if kind == "bimodal" and (values[1] > 1 or values[2] > values[3]):
            raise ConfigError(f"--delay {spec!r}: P must be in [0, 1] and LOW <= HIGH")
        if kind == "markov" and (values[0] > 1 or values[1] > 1):
            raise ConfigError(f"--delay {spec!r}: PS and PF are probabilities in [0, 1]")
        return _Term(kind, values)
    if kind == "fixed" and len(parts) == 2:
        workers = tuple(_worker(w, n, spec) for w in parts[0].split(","))
        return _Term("fixed", (_number(parts[1], "the delay", spec),), workers)
    if kind in ("random", "persistent") and len(parts) == 2:
        return _Term(kind, (_count(parts[0], n, spec), _number(parts[1], "the delay", spec)))
    if kind == "hang" and rest.count("@") == 1:
        w, step = rest.split("@")
        if not step.isdigit():
            raise ConfigError(f"--delay {spec!r}: STEP must be a non-negative integer, got {step!r}")
        return _Term("hang", (float(step),), (_worker(w, n, spec),))
    if kind == "trace" and rest:
        return _Term("trace", table=read_trace(Path(rest), n))
    raise ConfigError(f"--delay {spec!r} is not a straggler model: {USAGE}")


# A trace is read by every rank; beyond this size it is almost surely not a trace of this run
# (64 MiB holds about 3.5 million worker,step,delay rows).
MAX_TRACE_BYTES = 64 * 2**20


class Trace:
    """Delays replayed from a trace file: sorted (worker, step) keys and their summed delays, as
    two NumPy arrays (a dict of millions of tuples would take gigabytes)."""

    def __init__(self, workers: np.ndarray, steps: np.ndarray, delays: np.ndarray):
        keys = workers.astype(np.int64) << 40 | steps.astype(np.int64)
        self.keys, inverse = np.unique(keys, return_inverse=True)
        self.delays = np.zeros(len(self.keys))
        np.add.at(self.delays, inverse, delays)  # repeated (worker, step) rows add up

    def get(self, worker: int, step: int) -> float:
        """The delay of (worker, step); 0 when the trace has none."""
        key = worker << 40 | step
        k = int(np.searchsorted(self.keys, key))
        return float(self.delays[k]) if k < len(self.keys) and self.keys[k] == key else 0.0


def read_trace(path: Path, n: int) -> Trace:
    """The delays of a CSV trace with a header row naming worker, step and delay (streamed; the
    first bad line is reported by number)."""
    where = f"--delay trace:{path}"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file")
    if path.stat().st_size > MAX_TRACE_BYTES:
        raise ConfigError(f"{where}: {path.stat().st_size / 2**20:.0f} MiB is more than the {MAX_TRACE_BYTES >> 20} "
                          f"MiB a trace may have; keep only the workers and steps this run uses")
    workers, steps, delays = array("q"), array("q"), array("d")
    line = 1
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            columns = _trace_columns(next(reader, None), where)
            for line, row in enumerate(reader, start=2):
                worker, step, delay = _trace_row(row, columns, n, where, line)
                workers.append(worker)
                steps.append(step)
                delays.append(delay)
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: line {line + 1} is not CSV text ({exc})") from None
    return Trace(np.frombuffer(workers, np.int64), np.frombuffer(steps, np.int64), np.frombuffer(delays))


def _trace_columns(header: list[str] | None, where: str) -> tuple[int, int, int]:
    names = [h.strip() for h in header or []]
    if not {"worker", "step", "delay"} <= set(names):
        raise ConfigError(f"{where}: the header must name the columns worker,step,delay")
    return names.index("worker"), names.index("step"), names.index("delay")


def _trace_row(row: list[str], columns: tuple[int, int, int], n: int, where: str, line: int) -> tuple[int, int, float]:
    try:
        worker, step, delay = int(row[columns[0]]), int(row[columns[1]]), float(row[columns[2]])
    except (IndexError, ValueError):
        raise ConfigError(f"{where}: line {line} is not worker,step,delay numbers") from None
    if not 0 <= worker < n or not 0 <= step < 2**40 or not delay >= 0:
        raise ConfigError(f"{where}: line {line}: worker must be in 0..{n - 1}, step in 0..2**40 "
                          f"and delay >= 0 (inf for a hang)")
    return worker, step, delay


def write_trace(path: Path, rows: list[tuple[int, int, float]]) -> None:
    """Write (worker, step, delay) rows as a trace CSV that trace:FILE replays."""
    with Path(path).open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["worker", "step", "delay"])
        writer.writerows(sorted(rows))
