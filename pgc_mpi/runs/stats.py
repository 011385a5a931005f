"""Statistics over seeds: mean and spread, confidence intervals, and paired comparisons.

Confidence intervals are Student-t intervals for the mean over seeds (the seeds are independent
draws of data order and delays): mean ± t(0.975, k-1)·sd/√k for k values, with t's quantile
computed here from its distribution function (no SciPy).

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


@dataclass(frozen=True)
class Interval:
    """A mean over k values with its 95% confidence interval (low, high; nan for k < 2)."""

    mean: float
    low: float
    high: float
    k: int

    def excludes(self, value: float) -> bool:
        """Whether `value` lies outside the interval (never, when the interval is unknown)."""
        return not math.isnan(self.low) and not self.low <= value <= self.high

    def __str__(self) -> str:
        if math.isnan(self.mean):
            return "-"
        if math.isnan(self.low):
            return f"{self.mean:.3g}"
        return f"{self.mean:.3g} [{self.low:.3g}, {self.high:.3g}]"


def interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """The mean of the finite values and its Student-t confidence interval at `level`."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    k = len(finite)
    if k == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(np.mean(finite))
    if k < 2:
        return Interval(mean, math.nan, math.nan, 1)
    half = t_quantile(0.5 + level / 2, k - 1) * float(np.std(finite, ddof=1)) / math.sqrt(k)
    return Interval(mean, mean - half, mean + half, k)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with df degrees of freedom (bisection on its CDF)."""
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"need 0 < p < 1 and df >= 1, got p={p}, df={df}")
    low, high = -1e3, 1e3
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz's method)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below this point: use the symmetry
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * result / a


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


def paired_line(what: str, values: dict[str, Sequence[float]], unit: str, scale: float = 1.0) -> str:
    """One line of a paired A/B benchmark: each variant's mean (times `scale`, in `unit`) and the
    ratio of the second to the first, taken pair by pair, with its 95% interval. `values` holds
    two variants in order, {name: one value per pair}."""
    (a, first), (b, second) = values.items()
    ratio = interval([y / x for x, y in zip(first, second)])
    return (f"{what}: {a} {scale * float(np.mean(first)):.2f} {unit}, {b} {scale * float(np.mean(second)):.2f} "
            f"{unit}, {b}/{a} {ratio.mean:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]")


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> Interval:
    """The ratio of the first to the second, taken pair by pair (pair k = seed k, over the common
    pairs: the shorter length), its mean and 95% interval; a pair where either is not finite or
    the denominator is 0 is left out (nan: no pair left)."""
    ratios = [a / b for a, b in zip(numerators, denominators)
              if math.isfinite(a) and math.isfinite(b) and b != 0]
    return interval(ratios)
