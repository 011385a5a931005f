"""pgc-advise's paired rule (pgc_mpi.sim.recommend) on numbers, and its adaptive seeds
(pgc_mpi.commands.advise.adaptive) with the simulations replaced by per-seed times: issue 48's
heavy-tailed failure (a wide interval of dgd's times passed for a tie and dgd was recommended at
4.3x the fastest's time) must not recur, a real tie still goes to the simplest candidate, and a
leader in doubt gets more seeds, up to the budget."""

from __future__ import annotations

import argparse
import math

from pgc_mpi.runs.stats import interval, paired_ratio
from pgc_mpi.sim.recommend import MARGIN, CandidateResult, compare, contenders, recommend


def result(scheme: str, s: int | None, times: list[float | None]) -> CandidateResult:
    reached = [t for t in times if t is not None]
    return CandidateResult(scheme, s, len(times), len(reached), interval(reached), interval([10.0] * len(reached)),
                           interval([1.0] * len(times)), times=tuple(math.inf if t is None else t for t in times))


def old_rule_ties(a: CandidateResult, b: CandidateResult) -> bool:
    """The rule before issue 48: a tie when the 95% intervals of the times overlap."""
    return a.time.low <= b.time.high and b.time.low <= a.time.high


def test_the_issue_heavy_tail_does_not_recommend_dgd():
    """Issue 48's numbers: pgc-fr s=3 6.2 s, dgd 30.1 s with an interval of [-38, 98] from one
    seed's tail (the same tail slows pgc-fr a little: the seeds share the delays)."""
    pgc = result("pgc-fr", 3, [5.8, 6.1, 6.7])
    dgd = result("dgd", None, [14.0, 14.5, 61.8])
    isgd = result("is-sgd", 3, [8.2, 8.6, 8.4])
    assert old_rule_ties(dgd, pgc) and dgd.time.low < 0  # the old rule: a tie, and dgd the simplest of it
    advice = recommend([dgd, isgd, pgc])
    assert advice.choice == pgc and advice.clear and advice.settled
    verdict = advice.comparisons["dgd"]
    assert verdict.verdict == "slower" and verdict.slower_everywhere and verdict.ratio.mean > 4
    assert verdict.ratio.low < 1 < verdict.ratio.high  # its paired interval holds 1, yet every seed says slower
    assert advice.comparisons["is-sgd s=3"].verdict == "slower"


def test_a_heavy_tail_with_mixed_seeds_is_unsure_and_never_a_tie():
    pgc = result("pgc-fr", 3, [6.0, 6.0, 6.5])
    dgd = result("dgd", None, [5.9, 7.0, 40.0])  # faster on one seed, 6x slower on another
    advice = recommend([dgd, pgc])
    assert advice.choice == pgc and advice.clear and not advice.settled and advice.unsure == (dgd,)
    assert advice.comparisons["dgd"].verdict == "unsure"
    assert "NOT SURE of its lead" in advice.describe() and "dgd 2.77 [" in advice.describe()
    assert "lead outside the noise" not in advice.describe()
    assert contenders(advice) == [pgc, dgd]


def test_a_real_tie_goes_to_the_simpler_as_before():
    pgc = result("pgc-fr", 1, [6.0, 6.2, 6.4])
    dgd = result("dgd", None, [6.1, 6.1, 6.5])  # paired ratios 1.017, 0.984, 1.016
    ratio = dgd.ratio_to(pgc)
    assert abs(ratio.mean - 1) <= MARGIN and ratio.low <= 1 <= ratio.high
    advice = recommend([pgc, dgd])
    assert advice.fastest == pgc and advice.choice == dgd and set(advice.tie) == {pgc, dgd} and advice.settled
    assert "dgd is the simplest" in advice.describe()


def test_slower_on_every_seed_never_ties_however_close():
    pgc = result("pgc-fr", 1, [6.0, 7.0, 6.5])
    dgd = result("dgd", None, [6.01, 7.02, 6.51])
    advice = recommend([pgc, dgd])
    assert advice.choice == pgc and advice.clear and advice.settled
    assert compare(dgd, pgc).verdict == "slower" and compare(dgd, pgc).slower_everywhere


def test_an_interval_holding_1_outside_the_margin_is_unsure():
    pgc = result("pgc-fr", 1, [6.0, 6.0, 6.0])
    isgd = result("is-sgd", 1, [5.9, 7.2, 6.6])  # 0.983, 1.2, 1.1: mean 1.09, interval holds 1
    assert compare(isgd, pgc).verdict == "unsure" and not recommend([pgc, isgd]).settled


def test_a_candidate_missing_the_target_on_a_seed_is_not_counted_but_its_ratio_is_reported():
    pgc = result("pgc-fr", 1, [6.0, 6.0, 6.0])
    gc = result("gc-cr", 1, [3.0, None, 3.0])  # faster where it reached, but it missed a seed
    advice = recommend([gc, pgc])
    assert advice.choice == pgc and advice.settled
    c = advice.comparisons["gc-cr s=1"]
    assert c.verdict == "not counted" and c.ratio.mean == 0.5 and c.ratio.k == 2


def test_paired_ratio_takes_the_common_finite_seeds():
    r = paired_ratio([2.0, 3.0, math.inf, 8.0], [1.0, 3.0, 1.0])
    assert r.k == 2 and r.mean == 1.5
    assert math.isnan(paired_ratio([math.inf], [1.0]).mean)


def test_the_fastest_is_taken_among_the_candidates_on_the_most_seeds():
    # after a round of more seeds: a slower candidate kept its 2 seeds, the contenders have 4
    kept = result("is-sgd", 1, [7.0, 7.1])
    a, b = result("pgc-fr", 1, [6.0, 6.0, 9.0, 9.0]), result("pgc-cr", 1, [6.1, 6.1, 6.2, 6.1])
    advice = recommend([kept, a, b])
    assert advice.fastest == b and advice.comparisons["is-sgd s=1"].ratio.k == 2


# --- the adaptive seeds, the simulations replaced by per-seed times ---------------------------------

def fake_adaptive(monkeypatch, table: dict[str, list[float]], seeds: int, max_seeds: int):
    """advise.adaptive with `table` ({name: time per seed index}) standing for the simulations;
    returns (results, recommendation, rounds, {name: seeds simulated})."""
    from pgc_mpi.commands import advise
    from pgc_mpi.sim import advice
    from pgc_mpi.sim.advice import Candidate

    simulated: dict[str, int] = {}

    def simulate_seeds(planned, problem, start, stop, delays):
        for c in planned:
            simulated[c.name] = simulated.get(c.name, 0) + stop - start
        return {c: table[c.name][start:stop] for c in planned}

    monkeypatch.setattr(advice, "replay", lambda *a: None)
    monkeypatch.setattr(advice, "simulate_seeds", simulate_seeds)
    monkeypatch.setattr(advice, "summarize", lambda c, runs, target: result(c.scheme, c.s, list(runs)))
    planned = {Candidate(n.split(" s=")[0], int(n.split(" s=")[1]) if " s=" in n else None): None for n in table}
    args = argparse.Namespace(seeds=seeds, delay_model="trace", max_steps=10)
    _, results, chosen, rounds = advise.adaptive(None, args, None, planned, None, None, max_seeds)
    return results, chosen, rounds, simulated


def test_a_leader_in_doubt_gets_more_seeds_for_the_contenders_only(monkeypatch):
    table = {"pgc-fr s=1": [6.0, 6.0, 6.5, 6.1, 6.0, 6.2, 6.1, 6.0],
             "dgd": [5.9, 7.0, 15.0, 9.0, 9.1, 8.8, 9.5, 9.0],  # unsure after 3 seeds, separated after 6
             "is-sgd s=1": [9.0, 9.1, 9.2, 9.0, 9.1, 9.0, 9.3, 9.0]}  # slower at once: keeps its 3 seeds
    results, chosen, rounds, simulated = fake_adaptive(monkeypatch, table, 3, 12)
    assert rounds == [3, 6]
    assert simulated == {"pgc-fr s=1": 6, "dgd": 6, "is-sgd s=1": 3}
    assert chosen.choice.name == "pgc-fr s=1" and chosen.settled


def test_the_budget_ends_the_seeds_and_the_advice_says_it_is_not_sure(monkeypatch):
    from pgc_mpi.commands import advise_report

    table = {"pgc-fr s=1": [6.0, 6.0, 6.5, 6.0, 6.0, 6.5], "dgd": [5.9, 7.0, 40.0, 5.9, 7.0, 40.0]}
    results, chosen, rounds, _ = fake_adaptive(monkeypatch, table, 2, 5)
    assert rounds == [2, 4, 5] and not chosen.settled and chosen.choice.name == "pgc-fr s=1"
    note = advise_report.seeds_note(chosen, rounds, 5, 60)
    assert "NOT SURE after 5 seeds" in note and "--max-seeds 10" in note and "a longer probe" in note
    row = advise_report.row_of(next(r for r in results if r.name == "dgd"), chosen)
    assert row["verdict"] == "unsure" and row["ratio"] > 1 and row["ratio_low"] < 1 < row["ratio_high"]
    assert row["times"] == [5.9, 7.0, 40.0, 5.9, 7.0]
