"""The master's per-step bookkeeping for coded schemes, with no clock and no MPI.

The MPI master and the simulator both feed it the messages they see (worker, step, buffer
versions) and ask it whether the step can be decoded and with which weights; the deadline
policy is applied here too, so both drivers take the same decisions on the same arrivals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .errors import ConfigError, NotDecodable, PgcError
from .schemes import CodedScheme

DEADLINE_POLICIES = ("wait", "partial", "fail")


def check_deadline(deadline: float | None, policy: str) -> None:
    """Raise ConfigError unless `deadline` is None or a number > 0 and `policy` is a known one
    (the same rule for pgc-train's and the simulator's configurations)."""
    if deadline is not None and not (isinstance(deadline, (int, float)) and math.isfinite(deadline) and deadline > 0):
        raise ConfigError(f"--deadline must be a number > 0, got {deadline!r}")
    if policy not in DEADLINE_POLICIES:
        raise ConfigError(f"--on-deadline {policy!r} is not one of: {', '.join(DEADLINE_POLICIES)}")


class DeadlineMissed(PgcError):
    """The decode condition did not hold by the deadline and the policy is `fail`."""


@dataclass
class Decoded:
    """The outcome of a step: weights over all n workers and what they were computed from."""

    weights: np.ndarray
    used: list[int]
    residual: float
    max_staleness: int
    partial: bool


@dataclass
class StepCollector:
    """Arrivals of one step, in order, and the verdict on every message offered."""

    scheme: CodedScheme
    max_staleness: int | None = None
    step: int = -1
    arrived: list[int] = field(default_factory=list)
    versions: dict[int, list[int]] = field(default_factory=dict)
    late: int = 0
    rejected: list[int] = field(default_factory=list)

    def begin(self, step: int) -> None:
        """Start collecting for `step`."""
        self.step = step
        self.arrived, self.versions, self.late, self.rejected = [], {}, 0, []
        self._tracker = self.scheme.tracker()

    def offer(self, worker: int, step: int, versions: Sequence[int]) -> str:
        """Record a message; returns 'accepted', 'late', 'stale', 'duplicate', 'unknown' or 'future'."""
        if step < self.step:
            self.late += 1
            return "late"
        if step > self.step:
            return "future"
        if not 0 <= worker < self.scheme.n:
            return "unknown"
        if worker in self.versions:
            return "duplicate"
        if self.max_staleness is not None and self.step - min(versions) > self.max_staleness:
            self.rejected.append(worker)
            return "stale"
        self.arrived.append(worker)
        self.versions[worker] = list(versions)
        self._tracker.add(worker)
        return "accepted"

    @property
    def last_counted(self) -> bool:
        """Whether the last accepted message enters a streaming decoder's sum (see ReadyTracker)."""
        return self._tracker.counted

    def ready(self) -> bool:
        """Whether the scheme's decode condition holds for the arrivals so far."""
        return self._tracker.is_ready()

    def decode(self, partial: bool = False) -> Decoded:
        """Decode weights for the arrivals (NotDecodable when they are not enough)."""
        a = self.scheme.decode_weights(self.arrived, partial=partial)
        used = [i for i in self.arrived if a[i] != 0.0]
        stale = max((self.step - min(self.versions[i]) for i in used), default=0)
        return Decoded(a, used, self.scheme.residual(a), stale, partial)

    def on_deadline(self, policy: str) -> Decoded | None:
        """Apply the deadline policy: a partial decode, None to keep waiting, or DeadlineMissed."""
        if policy == "fail":
            missing = sorted(set(range(self.scheme.n)) - set(self.arrived))
            raise DeadlineMissed(
                f"step {self.step}: {self.scheme.name} could not decode by the deadline "
                f"({len(self.arrived)} of {self.scheme.n} workers arrived; missing workers {missing})"
            )
        if policy == "partial":
            try:
                return self.decode(partial=True)
            except NotDecodable:
                return None
        return None
