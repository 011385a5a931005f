"""Encoding matrices and the decoders that need linear algebra or combinatorics."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import NotDecodable

# A decoding whose partition weights miss 1 by more than this is not an exact decode.
EXACT_TOLERANCE = 1e-6


def support_matrix(placement: list[list[int]], n: int) -> np.ndarray:
    """B with ones on the placement: every worker sends the plain sum of its buffers."""
    B = np.zeros((n, n))
    for i, parts in enumerate(placement):
        B[i, parts] = 1.0
    return B


def tandon_cr_matrix(n: int, s: int, seed: int, candidates: int = 16) -> np.ndarray:
    """Tandon et al.'s randomized cyclic-repetition encoding (Alg. 2), seeded.

    Every row lies in null(H) for a random H with H @ 1 = 0, so with probability 1 any
    n - s rows span a space that contains the all-ones vector. A draw whose small s x s
    solves blow up makes decoding ill-conditioned, so of `candidates` seeded draws the one
    with the smallest largest coefficient is kept.
    """
    if s == 0:
        return np.eye(n)
    rng = np.random.default_rng([seed, n, s, 0x7A9D])
    best = None
    for _ in range(candidates):
        H = rng.standard_normal((s, n))
        H[:, -1] = -H[:, :-1].sum(axis=1)
        B = np.zeros((n, n))
        for i in range(n):
            others = [(i + k) % n for k in range(1, s + 1)]
            B[i, i] = 1.0
            B[i, others] = -np.linalg.solve(H[:, others], H[:, i])
        if best is None or np.abs(B).max() < np.abs(best).max():
            best = B
    return best


def solve_least_squares(B: np.ndarray, arrived: Sequence[int]) -> np.ndarray:
    """Minimum-norm least-squares a' of B_F^T a' = 1 over the arrived rows; returns a = a'/n.

    Exact when the arrived rows span the all-ones vector, the closest decode otherwise.
    """
    n = B.shape[0]
    rows = list(arrived)
    coef, *_ = np.linalg.lstsq(B[rows].T, np.ones(n), rcond=None)
    a = np.zeros(n)
    a[rows] = coef / n
    return a


def solve_exact(B: np.ndarray, arrived: Sequence[int]) -> np.ndarray:
    """Like solve_least_squares, but raises NotDecodable unless a^T B = 1/n holds."""
    a = solve_least_squares(B, arrived)
    n = B.shape[0]
    residual = float(np.abs(a @ B - 1.0 / n).max()) * n
    if residual > EXACT_TOLERANCE:
        raise NotDecodable(
            f"workers {sorted(arrived)} cannot decode the exact gradient "
            f"(residual {residual:.2e}); wait for more arrivals"
        )
    return a


def disjoint_windows(starts: Sequence[int], n: int, c: int) -> list[int]:
    """Largest subset of cyclic windows [i, i+c) mod n (one per start) that are pairwise disjoint.

    An optimal subset can always be made to contain a window starting in [p, p+c) for any
    arrived p (swap the optimal window that overlaps p's for p's own), so it suffices to
    try those as the first window and fill greedily around the ring: O(c * |starts|).
    """
    ordered = sorted(set(starts))
    if not ordered:
        return []
    if c * 2 > n:  # any two windows overlap: one window is the best there is
        return [ordered[0]]
    p = ordered[0]
    best: list[int] = []
    for first in ordered:
        if first - p >= c:
            break
        chosen = [first]
        limit = first + n  # the ring unrolled once, starting at `first`
        end = first + c
        for x in ordered + [q + n for q in ordered]:
            if x >= end and x + c <= limit:
                chosen.append(x % n)
                end = x + c
        if len(chosen) > len(best):
            best = chosen
    return best
