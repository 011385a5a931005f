"""pgc-advise's rule: which candidate (scheme, s, options) to recommend from their simulated times to a target.

The candidates of one seed share the delays (the same replayed trace, the same draws), so they are
compared paired by seed: a candidate's **ratio** to another is its time to target over the other's,
seed by seed, summarized as a mean and a 95% Student-t interval (pgc_mpi.runs.stats.paired_ratio;
one seed: the ratio alone, no interval). A heavy-tailed seed that makes one candidate slow makes
the others slow too, and a wide interval of times no longer passes for a tie. The rule:

1. only candidates that reached the target on every seed they ran count (a candidate that missed
   it on some seed is never recommended and never in a tie, as before; its ratio is still reported,
   over the seeds both reached);
2. the **fastest** is the counted candidate with the lowest mean time to target among those run on
   the most seeds (pgc-advise adds seeds to the contenders only: see `contenders`);
3. each other counted candidate's paired ratio to the fastest (over the seeds both ran) gives it a
   verdict:
   - **tie**: the ratio's 95% interval holds 1 and its mean is within MARGIN of 1 (|mean - 1| <=
     5%), and it is not slower on every seed (one seed: its ratio is exactly 1);
   - **unsure**: the interval holds 1 but the mean is outside the margin (more seeds could
     separate them either way), unless it is slower on every seed by more than the margin (every
     seed's ratio above 1.05: the seeds agree, and the rule would not pick it whatever more seeds
     said short of overturning every one); or the interval lies below 1 (faster seed by seed,
     though its mean time is not: the fastest is in doubt);
   - **slower**: otherwise: the interval lies above 1, or it is slower on every seed (never a tie,
     however close), or one seed and a ratio above 1;
4. the fastest and the tied are a tie and the simplest of them is recommended: dgd < is-sgd < gc <
   is-gc < pgc < pbs, then fr before cr, then the smaller s (simpler to run, less to go wrong,
   fewer gradients per step at equal time), then the fewest extra options (--drop-compute,
   --abandon-late); without a tie, the fastest. The recommendation is
   **settled** when no candidate is unsure.

Pure: no torch, no simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..runs.stats import Interval, paired_ratio

# From the simplest to the most involved (the family: a scheme's name without -fr or -cr)
FAMILIES = ("dgd", "is-sgd", "gc", "is-gc", "pgc", "pbs")
MARGIN = 0.05  # a tie's mean paired ratio to the fastest is within this of 1 (rule 3)
VERDICTS = ("fastest", "tie", "unsure", "slower", "not counted")


def simplicity(scheme: str, s: int | None) -> tuple[int, int, int]:
    """A sort key from the simplest candidate to the most involved (see the module's rule 4)."""
    family, _, variant = scheme.rpartition("-") if scheme.endswith(("-fr", "-cr")) else (scheme, "", "")
    rank = FAMILIES.index(family) if family in FAMILIES else len(FAMILIES)
    return rank, {"": 0, "fr": 0, "cr": 1}.get(variant, 2), s or 0


def candidate_name(scheme: str, s: int | None, flags: tuple[str, ...] = ()) -> str:
    """How a candidate is named: its scheme, its s where it depends on it, its extra options."""
    return " ".join([scheme, *([] if s is None else [f"s={s}"]), *flags])


@dataclass(frozen=True)
class CandidateResult:
    """One candidate's simulated figures over its seeds (times in simulated seconds).

    `times`: its time to target on each seed, in the seeds' order (inf: not reached), what the
    paired ratios are taken from; `time` and `steps`: to the target, over the seeds that reached
    it; `step_time`: the median step time, over every seed; `final_loss`, `final_accuracy`: the
    last evaluation's, mean over the seeds (nan: none)."""

    scheme: str
    s: int | None  # None: the scheme does not depend on s
    seeds: int
    reached: int
    time: Interval
    steps: Interval
    step_time: Interval
    final_loss: float = math.nan
    final_accuracy: float = math.nan
    times: tuple[float, ...] = ()
    flags: tuple[str, ...] = ()  # the options it runs with beyond the probe's (--drop-compute auto, ...)

    @property
    def name(self) -> str:
        return candidate_name(self.scheme, self.s, self.flags)

    @property
    def order(self) -> tuple:
        """Its place from the simplest to the most involved: simplicity, then the fewest options."""
        return simplicity(self.scheme, self.s), len(self.flags)

    @property
    def counted(self) -> bool:
        """Whether it reached the target on every seed (rule 1)."""
        return self.seeds > 0 and self.reached == self.seeds and not math.isnan(self.time.mean)

    def ratio_to(self, other: CandidateResult) -> Interval:
        """Its paired ratio to `other`: its time over other's, seed by seed, over the seeds both
        ran and reached the target on (mean and 95% interval)."""
        return paired_ratio(self.times, other.times)


@dataclass(frozen=True)
class Comparison:
    """A candidate against the fastest: its paired ratio and its verdict (VERDICTS)."""

    ratio: Interval
    verdict: str
    slower_everywhere: bool = False

    def describe(self) -> str:
        r = self.ratio
        if math.isnan(r.mean):
            return "no seed in common"
        spread = f"{r.mean:.3g}" if math.isnan(r.low) else f"{r.mean:.3g} [{r.low:.3g}, {r.high:.3g}]"
        return f"{spread} over {r.k} seed(s)"


def compare(candidate: CandidateResult, fastest: CandidateResult) -> Comparison:
    """The verdict of rule 3 on `candidate` against `fastest`."""
    if candidate is fastest:
        return Comparison(candidate.ratio_to(fastest), "fastest")
    ratio = candidate.ratio_to(fastest)
    if not candidate.counted or math.isnan(ratio.mean):
        return Comparison(ratio, "not counted")
    pairs = [a / b for a, b in zip(candidate.times, fastest.times) if math.isfinite(a) and math.isfinite(b) and b]
    slower_everywhere = all(x > 1 for x in pairs)
    beyond_everywhere = all(x > 1 + MARGIN for x in pairs)  # slower on every seed by more than the margin
    known = not math.isnan(ratio.low)
    holds = ratio.low <= 1 <= ratio.high if known else ratio.mean == 1
    within = abs(ratio.mean - 1) <= MARGIN
    if holds and within and not slower_everywhere:
        verdict = "tie"
    elif holds and not within and not beyond_everywhere or known and ratio.high < 1:
        verdict = "unsure"
    else:
        verdict = "slower"
    return Comparison(ratio, verdict, slower_everywhere)


@dataclass(frozen=True)
class Recommendation:
    """The candidate recommended, the tie it was chosen from (empty: the fastest alone), the
    fastest, and every candidate's comparison with the fastest ({name: Comparison})."""

    choice: CandidateResult
    tie: tuple[CandidateResult, ...] = ()
    fastest: CandidateResult | None = None
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    unsure: tuple[CandidateResult, ...] = ()

    @property
    def clear(self) -> bool:
        return not self.tie

    @property
    def settled(self) -> bool:
        """Whether every other candidate is separated from the fastest: tied or slower, none unsure."""
        return not self.unsure

    def describe(self) -> str:
        """The recommendation and why, in one sentence (two when it is not sure)."""
        c, fastest = self.choice, self.fastest or self.choice
        if self.clear and self.settled:
            text = (f"recommended: {c.name}: the fastest to the target, {c.time.mean:.4g} s, with a lead outside the "
                    f"noise (paired by seed, every other candidate is slower on every seed or its time ratio's 95% "
                    f"interval lies above 1)")
        elif self.clear:
            text = (f"recommended: {c.name}: the fastest to the target, {c.time.mean:.4g} s; no candidate ties with "
                    f"it (paired by seed: a time ratio whose 95% interval holds 1 and mean is within ±{MARGIN:.0%})")
        else:
            names = ", ".join(r.name for r in self.tie)
            text = (f"recommended: {c.name}: a tie within the noise between {names} (paired time ratios to the "
                    f"fastest, {fastest.name} at {fastest.time.mean:.4g} s, whose 95% interval holds 1 and mean is "
                    f"within ±{MARGIN:.0%} of it); {c.name} is the simplest of them")
        if self.unsure:
            doubts = "; ".join(f"{r.name} {self.comparisons[r.name].describe()}" for r in self.unsure)
            text += (f". NOT SURE of its lead: the paired ratio to {fastest.name} holds 1 but is not within "
                     f"±{MARGIN:.0%}, or lies below 1, for {doubts}")
        return text


def recommend(results: list[CandidateResult]) -> Recommendation | None:
    """The module's rule applied to `results`; None when no candidate reached the target on every seed."""
    counted = [r for r in results if r.counted]
    if not counted:
        return None
    most = max(r.seeds for r in counted)
    fastest = min((r for r in counted if r.seeds == most), key=lambda r: (r.time.mean, r.order))
    comparisons = {r.name: compare(r, fastest) for r in results}
    tie = [r for r in counted if comparisons[r.name].verdict == "tie"]
    unsure = tuple(r for r in counted if comparisons[r.name].verdict == "unsure")
    if not tie:
        return Recommendation(fastest, (), fastest, comparisons, unsure)
    tie = sorted([fastest, *tie], key=lambda r: r.time.mean)
    return Recommendation(min(tie, key=lambda r: r.order), tuple(tie), fastest, comparisons, unsure)


def contenders(advice: Recommendation) -> list[CandidateResult]:
    """The candidates more seeds could move: the fastest, the tied and the unsure (the slower and
    those that missed the target keep their seeds)."""
    fastest = advice.fastest or advice.choice
    return [fastest, *(r for r in (*advice.tie, *advice.unsure) if r is not fastest)]
