"""pgc-advise's rule: which candidate (scheme, s) to recommend from their simulated times to a target.

Each candidate ran on the same seeds; its time to target is summarized over the seeds that reached
it as a mean and a 95% Student-t interval (pgc_mpi.runs.stats.interval; one seed: the interval is
the mean alone, there is no spread to judge the noise by). The rule:

1. only candidates that reached the target on every seed count;
2. the fastest (lowest mean time) is recommended when its interval overlaps no other counted
   candidate's: its lead is outside the noise;
3. otherwise the fastest and every candidate whose interval overlaps the fastest's are a tie, and
   the simplest of them is recommended: dgd < is-sgd < gc < is-gc < pgc < pbs, then fr before cr,
   then the smaller s (simpler to run, less to go wrong, fewer gradients per step at equal time).

Pure: no torch, no simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..runs.stats import Interval

# From the simplest to the most involved (the family: a scheme's name without -fr or -cr)
FAMILIES = ("dgd", "is-sgd", "gc", "is-gc", "pgc", "pbs")


def simplicity(scheme: str, s: int | None) -> tuple[int, int, int]:
    """A sort key from the simplest candidate to the most involved (see the module's rule 3)."""
    family, _, variant = scheme.rpartition("-") if scheme.endswith(("-fr", "-cr")) else (scheme, "", "")
    rank = FAMILIES.index(family) if family in FAMILIES else len(FAMILIES)
    return rank, {"": 0, "fr": 0, "cr": 1}.get(variant, 2), s or 0


@dataclass(frozen=True)
class CandidateResult:
    """One candidate's simulated figures over its seeds (times in simulated seconds).

    `time` and `steps`: to the target, over the seeds that reached it; `step_time`: the median
    step time, over every seed; `final_loss`, `final_accuracy`: the last evaluation's, mean over
    the seeds (nan: none)."""

    scheme: str
    s: int | None  # None: the scheme does not depend on s
    seeds: int
    reached: int
    time: Interval
    steps: Interval
    step_time: Interval
    final_loss: float = math.nan
    final_accuracy: float = math.nan

    @property
    def name(self) -> str:
        return self.scheme if self.s is None else f"{self.scheme} s={self.s}"

    @property
    def counted(self) -> bool:
        """Whether it reached the target on every seed (rule 1)."""
        return self.seeds > 0 and self.reached == self.seeds and not math.isnan(self.time.mean)

    def bounds(self) -> tuple[float, float]:
        """Its time's 95% interval (the mean alone with one seed)."""
        return (self.time.mean, self.time.mean) if math.isnan(self.time.low) else (self.time.low, self.time.high)

    def overlaps(self, other: CandidateResult) -> bool:
        """Whether the two time intervals share a point."""
        (a, b), (c, d) = self.bounds(), other.bounds()
        return a <= d and c <= b


@dataclass(frozen=True)
class Recommendation:
    """The candidate recommended, and the tie it was chosen from (empty: a lead outside the noise)."""

    choice: CandidateResult
    tie: tuple[CandidateResult, ...] = ()
    fastest: CandidateResult | None = None

    @property
    def clear(self) -> bool:
        return not self.tie

    def describe(self) -> str:
        """The recommendation and why, in one sentence."""
        c = self.choice
        if self.clear:
            return (f"recommended: {c.name}: the fastest to the target, {c.time.mean:.4g} s, with a lead outside the "
                    f"noise (its 95% interval overlaps no other candidate's)")
        names = ", ".join(r.name for r in self.tie)
        fastest = self.fastest or c
        return (f"recommended: {c.name}: a tie within the noise between {names} (95% intervals overlapping the "
                f"fastest's, {fastest.name} at {fastest.time.mean:.4g} s); {c.name} is the simplest of them")


def recommend(results: list[CandidateResult]) -> Recommendation | None:
    """The module's rule applied to `results`; None when no candidate reached the target on every seed."""
    counted = [r for r in results if r.counted]
    if not counted:
        return None
    fastest = min(counted, key=lambda r: (r.time.mean, simplicity(r.scheme, r.s)))
    tie = [r for r in counted if r.overlaps(fastest)]
    if len(tie) == 1:
        return Recommendation(fastest, (), fastest)
    tie.sort(key=lambda r: r.time.mean)
    return Recommendation(min(tie, key=lambda r: simplicity(r.scheme, r.s)), tuple(tie), fastest)
