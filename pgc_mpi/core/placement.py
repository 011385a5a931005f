"""Data placements: which partitions each worker stores, in slot order."""

from __future__ import annotations

from ..errors import SchemeError


def single_placement(n: int) -> list[list[int]]:
    """Worker i stores partition i only (dgd, is-sgd)."""
    return [[i] for i in range(n)]


def fr_placement(n: int, c: int) -> list[list[int]]:
    """Fractional repetition: worker i is in group i // c and stores that group's c partitions."""
    if n % c:
        raise SchemeError(
            f"fractional-repetition placement needs c to divide n, got n={n}, c={c}: "
            f"use a worker count that is a multiple of {c} or a cyclic (-cr) scheme"
        )
    return [[(i // c) * c + k for k in range(c)] for i in range(n)]


def cr_placement(n: int, c: int) -> list[list[int]]:
    """Cyclic repetition: worker i stores partitions (i, i+1, ..., i+c-1) mod n."""
    return [[(i + k) % n for k in range(c)] for i in range(n)]


def holders(placement: list[list[int]], n: int) -> list[list[int]]:
    """For every partition, the workers that store it."""
    out: list[list[int]] = [[] for _ in range(n)]
    for worker, parts in enumerate(placement):
        for j in parts:
            out[j].append(worker)
    return out
