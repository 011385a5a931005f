"""Mean and spread over seeds, and the paired sign test."""

from __future__ import annotations

import math

import pytest

from pgc_mpi.stats import binomial_two_sided, mean_sd, sign_test


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
