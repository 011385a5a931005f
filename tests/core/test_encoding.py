"""Encoding matrices and linear/combinatorial decoders (pgc_mpi.core.encoding) against docs/ALGORITHMS.md."""

from __future__ import annotations

import itertools
import random
from functools import cache

import numpy as np
import pytest

from pgc_mpi.core.encoding import (
    EXACT_TOLERANCE,
    disjoint_windows,
    solve_exact,
    solve_least_squares,
    support_matrix,
    tandon_cr_matrix,
)
from pgc_mpi.core.placement import cr_placement, fr_placement
from pgc_mpi.errors import NotDecodable

SMALL = [(n, s) for n in range(2, 9) for s in range(n)]

# Tandon et al.'s worked example (n=3, s=1) and the decoding vectors a' it states.
TANDON_B = np.array([[0.5, 1.0, 0.0], [0.0, 1.0, -1.0], [0.5, 0.0, 1.0]])
TANDON_A = {(0, 1): (2.0, -1.0, 0.0), (0, 2): (1.0, 0.0, 1.0), (1, 2): (0.0, 1.0, 2.0)}


@pytest.mark.parametrize("arrived", list(TANDON_A))
@pytest.mark.parametrize("reverse", [False, True])
def test_tandon_worked_example(arrived, reverse):
    order = arrived[::-1] if reverse else arrived
    a = solve_exact(TANDON_B, order)
    # solve_exact returns a = a'/n.
    np.testing.assert_allclose(3 * a, TANDON_A[arrived], rtol=0, atol=1e-12)
    np.testing.assert_allclose(a @ TANDON_B, np.full(3, 1 / 3), rtol=0, atol=1e-12)


@pytest.mark.parametrize("worker", range(3))
def test_tandon_worked_example_one_worker_is_not_enough(worker):
    with pytest.raises(NotDecodable, match="cannot decode the exact gradient"):
        solve_exact(TANDON_B, [worker])
    a = solve_least_squares(TANDON_B, [worker])
    assert not np.any(np.delete(a, worker))
    assert np.abs(a @ TANDON_B - 1 / 3).max() > 1e-3


def test_least_squares_is_zero_outside_the_arrivals_and_exact_when_possible():
    B = tandon_cr_matrix(7, 2, seed=3)
    for arrived in itertools.combinations(range(7), 3):
        a = solve_least_squares(B, arrived)
        assert not np.any(np.delete(a, arrived))
    for arrived in itertools.combinations(range(7), 5):
        a = solve_least_squares(B, arrived)
        np.testing.assert_allclose(a @ B, np.full(7, 1 / 7), rtol=0, atol=1e-9)
        np.testing.assert_array_equal(a, solve_exact(B, arrived))


@pytest.mark.parametrize("n, s", SMALL)
def test_tandon_matrix_structure(n, s):
    B = tandon_cr_matrix(n, s, seed=0)
    support = support_matrix(cr_placement(n, s + 1), n)
    assert not np.any(B[support == 0]), "row i must be supported on (i, ..., i+s) mod n"
    np.testing.assert_array_equal(np.diag(B), np.ones(n))
    # Every row lies in null(H), which has dimension n - s.
    assert np.linalg.matrix_rank(B, tol=1e-9 * np.abs(B).max()) == n - s
    if s == 0:
        np.testing.assert_array_equal(B, np.eye(n))
    if s == n - 1:  # every worker stores everything: null(H) = span(1) forces all-ones rows
        np.testing.assert_allclose(B, np.ones((n, n)), rtol=0, atol=1e-9)


@pytest.mark.parametrize("n, s", SMALL)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tandon_matrix_every_n_minus_s_subset_decodes_exactly(n, s, seed):
    B = tandon_cr_matrix(n, s, seed)
    for arrived in itertools.combinations(range(n), n - s):
        a = solve_exact(B, arrived)
        np.testing.assert_allclose(a @ B, np.full(n, 1 / n), rtol=0, atol=1e-9)
        assert not np.any(np.delete(a, arrived))


@pytest.mark.parametrize("n, s", SMALL)
def test_tandon_matrix_is_seeded(n, s):
    np.testing.assert_array_equal(tandon_cr_matrix(n, s, 5), tandon_cr_matrix(n, s, 5))
    if 1 <= s <= n - 2:  # s = 0 and s = n-1 have no randomness left
        assert not np.allclose(tandon_cr_matrix(n, s, 5), tandon_cr_matrix(n, s, 6))


@pytest.mark.parametrize("n, c", [(4, 2), (6, 3), (6, 2), (5, 1)])
def test_support_matrix_is_ones_on_the_placement(n, c):
    for placement in ([[i] for i in range(n)], cr_placement(n, c)) + (
        (fr_placement(n, c),) if n % c == 0 else ()
    ):
        B = support_matrix(placement, n)
        assert set(np.unique(B)) <= {0.0, 1.0}
        for i, parts in enumerate(placement):
            assert set(np.flatnonzero(B[i])) == set(parts)


@pytest.mark.parametrize("miss, exact", [(0.0, True), (1e-9, True), (3e-7, True), (3e-6, False), (1e-4, False)])
def test_exact_tolerance_is_tight(miss, exact):
    """solve_exact accepts rounding-level misses and rejects a decode whose partition weights miss 1 by a few 1e-6.

    A lone row (1, 1 + 2 miss) can at best weight its partitions 1 - miss and 1 + miss (to first order)."""
    B = np.array([[1.0, 1.0 + 2 * miss], [0.0, 1.0]])
    a = solve_least_squares(B, [0])
    assert np.abs(a @ B * 2 - 1).max() == pytest.approx(miss, rel=1e-3, abs=1e-15)
    if exact:
        np.testing.assert_array_equal(solve_exact(B, [0]), a)
    else:
        with pytest.raises(NotDecodable, match="cannot decode the exact gradient"):
            solve_exact(B, [0])
    assert (miss <= EXACT_TOLERANCE) == exact  # the documented constant is the threshold in use


# ---- disjoint windows: brute force over every subset ---------------------------------------------


def _windows_disjoint(i: int, j: int, n: int, c: int) -> bool:
    """Cyclic windows [i, i+c) and [j, j+c) mod n share no partition."""
    return (j - i) % n >= c and (i - j) % n >= c


@cache
def _largest_disjoint(n: int, c: int) -> tuple[int, ...]:
    """For every bitmask of starts: the size of its largest pairwise-disjoint subset (brute force)."""
    best = [0] * (1 << n)
    for mask in range(1 << n):
        members = [i for i in range(n) if mask >> i & 1]
        if all(_windows_disjoint(i, j, n, c) for i, j in itertools.combinations(members, 2)):
            best[mask] = len(members)
    for bit in range(n):  # best[mask] = max over the subsets of mask
        for mask in range(1 << n):
            if mask >> bit & 1:
                best[mask] = max(best[mask], best[mask ^ (1 << bit)])
    return tuple(best)


@pytest.mark.parametrize("n", range(1, 9))
def test_disjoint_windows_is_a_largest_disjoint_subset(n):
    rng = random.Random(n)
    for c in range(1, n + 1):
        best = _largest_disjoint(n, c)
        for mask in range(1, 1 << n):
            starts = [i for i in range(n) if mask >> i & 1]
            shuffled = starts + rng.sample(starts, k=min(2, len(starts)))  # order and repeats
            rng.shuffle(shuffled)
            for given in (starts, shuffled):
                chosen = disjoint_windows(given, n, c)
                assert len(set(chosen)) == len(chosen), (n, c, given, chosen)
                assert set(chosen) <= set(starts), (n, c, given, chosen)
                assert all(_windows_disjoint(i, j, n, c) for i, j in itertools.combinations(chosen, 2))
                assert len(chosen) == best[mask], (n, c, given, chosen)


def test_disjoint_windows_examples():
    assert disjoint_windows([], 6, 2) == []
    assert sorted(disjoint_windows(range(6), 6, 2)) in ([0, 2, 4], [1, 3, 5])
    # 1, 3 and 5 wrap around: windows [5, 0] and [1, 2] would collide with 0's [0, 1].
    assert sorted(disjoint_windows([0, 1, 3, 5], 6, 2)) == [1, 3, 5]
    assert len(disjoint_windows([0, 2], 3, 2)) == 1
