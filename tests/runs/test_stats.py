"""Mean and spread over seeds, and the paired sign test."""

from __future__ import annotations

import math

import pytest

from pgc_mpi.runs.stats import binomial_two_sided, mean_sd, sign_test


def test_mean_sd_over_finite_values():
    assert mean_sd([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
    assert mean_sd([4.0, math.inf, math.nan]) == (4.0, 0.0)
    m, sd = mean_sd([math.inf])
    assert math.isnan(m) and math.isnan(sd)


def test_sign_test_counts_wins_and_gives_the_exact_binomial_p_value():
    result = sign_test([1, 2, 3, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6, 7, 8, 9])
    assert (result.wins, result.losses, result.ties) == (8, 0, 0)
    assert result.p_value == pytest.approx(2 / 256)
    mixed = sign_test([1, 5, 2, math.inf], [2, 4, 2, 3])  # a run that never reached the target loses
    assert (mixed.wins, mixed.losses, mixed.ties) == (1, 2, 1)
    assert mixed.p_value == 1.0
    assert str(mixed) == "1-2 (1 tied), p=1"
    with pytest.raises(ValueError, match="same length"):
        sign_test([1], [1, 2])


@pytest.mark.parametrize("k, n, p", [(0, 0, 1.0), (7, 8, 18 / 256), (1, 8, 18 / 256), (4, 8, 1.0), (6, 6, 2 / 64)])
def test_binomial_two_sided(k, n, p):
    assert binomial_two_sided(k, n) == pytest.approx(p)


def test_the_confidence_interval_of_a_known_sample():
    from pgc_mpi.runs.stats import interval, t_cdf, t_quantile

    # 1..5: mean 3, sd sqrt(2.5), t(0.975, 4) = 2.7764451...: half-width 2.7764451 * sqrt(2.5) / sqrt(5)
    ci = interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)
    assert (ci.mean, ci.low, ci.high, ci.k) == pytest.approx((3.0, 3.0 - half, 3.0 + half, 5))
    assert ci.excludes(5.0) and not ci.excludes(3.5)
    assert str(ci) == "3 [1.04, 4.96]"
    assert t_quantile(0.975, 1) == pytest.approx(12.706204736, rel=1e-8)
    assert t_quantile(0.975, 30) == pytest.approx(2.042272456, rel=1e-8)
    assert t_cdf(0.0, 7) == pytest.approx(0.5)
    one = interval([4.0, math.nan])
    assert one.mean == 4.0 and math.isnan(one.low) and not one.excludes(0.0) and str(one) == "4"
    assert str(interval([])) == "-"
