"""Statistics over seeds: mean and spread, and a paired comparison of two schemes.

Runs of two schemes with the same seed see the same data, partitions and delays, so they pair:
the sign test counts on how many seeds one beats the other and asks how likely so lopsided a
count is if neither were better (exact binomial, two-sided; ties are left out). It needs no
assumption about the shape of the differences, and a run that never reached the target (an
infinite time) still counts as a loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation of the finite values (nan, nan when none; sd 0 for one)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return math.nan, math.nan
    return float(np.mean(finite)), float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0


@dataclass(frozen=True)
class Paired:
    """How `a` fared against `b` over paired seeds, lower being better."""

    wins: int
    losses: int
    ties: int
    p_value: float  # exact two-sided sign test

    def __str__(self) -> str:
        return f"{self.wins}-{self.losses}" + (f" ({self.ties} tied)" if self.ties else "") + f", p={self.p_value:.3g}"


def sign_test(a: Sequence[float], b: Sequence[float]) -> Paired:
    """Paired sign test of a against b (same length, pair k = seed k); inf compares as the worst."""
    if len(a) != len(b):
        raise ValueError(f"paired samples need the same length, got {len(a)} and {len(b)}")
    wins = sum(x < y for x, y in zip(a, b))
    losses = sum(x > y for x, y in zip(a, b))
    return Paired(wins, losses, len(a) - wins - losses, binomial_two_sided(wins, wins + losses))


def binomial_two_sided(k: int, n: int) -> float:
    """P(a count at least as far from n/2 as k) for Binomial(n, 1/2); 1 when n is 0."""
    if n == 0:
        return 1.0
    tail = min(k, n - k)
    p = 2 * sum(math.comb(n, i) for i in range(tail + 1)) / 2**n
    return min(1.0, p)
