"""Straggler injection: seeded extra delays per (worker, step), parsed from a short spec.

Specs (combine several with '+', their delays add up):
  none               no injected delay
  exp:MEAN           every worker, every step: an exponential delay with that mean (seconds)
  fixed:W1,W2:SEC    those workers are always SEC seconds slower
  random:K:SEC       K workers drawn afresh every step are SEC seconds slower
  hang:W@STEP        worker W stops responding from that step on (an infinite delay)
Worker ids are 0..n-1 (MPI rank minus one). The same (seed, worker, step) always gives the
same delay, whatever order the delays are asked for in, so runs replay exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError

HANG = math.inf


@dataclass(frozen=True)
class _Term:
    kind: str
    workers: tuple[int, ...] = ()
    value: float = 0.0
    count: int = 0
    step: int = 0


class DelayModel:
    """Extra seconds a worker spends on a step, on top of its compute time."""

    def __init__(self, spec: str, n: int, seed: int = 0):
        self.spec, self.n, self.seed = spec, n, seed
        self._terms = [_parse_term(part.strip(), n) for part in spec.split("+")]
        self._terms = [t for t in self._terms if t.kind != "none"]

    def delay(self, worker: int, step: int, attempt: int = 0) -> float:
        """Injected delay of `worker` at `step` in seconds (math.inf: the worker hangs).

        `attempt` tells apart several computations of one worker at one step (pbs workers
        compute as often as they can, on whatever model is newest).
        """
        total = 0.0
        for index, term in enumerate(self._terms):
            if term.kind == "exp":
                rng = np.random.default_rng([self.seed, index, worker, step, attempt, 1])
                total += float(rng.exponential(term.value))
            elif term.kind == "fixed" and worker in term.workers:
                total += term.value
            elif term.kind == "random":
                rng = np.random.default_rng([self.seed, index, step, 2])
                if worker in rng.choice(self.n, size=term.count, replace=False):
                    total += term.value
            elif term.kind == "hang" and worker in term.workers and step >= term.step:
                return HANG
        return total

    def hangs(self) -> dict[int, int]:
        """{worker: first step at which it hangs} for every hang term."""
        return {t.workers[0]: t.step for t in self._terms if t.kind == "hang"}

    @property
    def active(self) -> bool:
        """Whether the model injects anything at all."""
        return bool(self._terms)


def _number(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--delay {spec!r}: {what} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"--delay {spec!r}: {what} must be a finite number >= 0, got {text!r}")
    return value


def _worker(text: str, n: int, spec: str) -> int:
    try:
        w = int(text)
    except ValueError:
        raise ConfigError(f"--delay {spec!r}: worker id must be an integer, got {text!r}") from None
    if not 0 <= w < n:
        raise ConfigError(f"--delay {spec!r}: worker id {w} is outside 0..{n - 1} (worker id = rank - 1)")
    return w


def _parse_term(spec: str, n: int) -> _Term:
    kind, _, rest = spec.partition(":")
    usage = "use none, exp:MEAN, fixed:W1,W2:SEC, random:K:SEC or hang:W@STEP (joined with '+')"
    if kind == "none" and not rest:
        return _Term("none")
    if kind == "exp" and rest:
        return _Term("exp", value=_number(rest, "the mean", spec))
    if kind == "fixed" and rest.count(":") == 1:
        ids, sec = rest.split(":")
        workers = tuple(_worker(w, n, spec) for w in ids.split(","))
        return _Term("fixed", workers=workers, value=_number(sec, "the delay", spec))
    if kind == "random" and rest.count(":") == 1:
        k, sec = rest.split(":")
        if not k.isdigit() or not 0 < int(k) <= n:
            raise ConfigError(f"--delay {spec!r}: K must be an integer in 1..{n} (the number of workers)")
        return _Term("random", count=int(k), value=_number(sec, "the delay", spec))
    if kind == "hang" and rest.count("@") == 1:
        w, step = rest.split("@")
        if not step.isdigit():
            raise ConfigError(f"--delay {spec!r}: STEP must be a non-negative integer, got {step!r}")
        return _Term("hang", workers=(_worker(w, n, spec),), step=int(step))
    raise ConfigError(f"--delay {spec!r} is not a straggler model: {usage}")
