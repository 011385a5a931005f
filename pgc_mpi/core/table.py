"""The pbs master's table: the newest gradient of every partition, with its version."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import SchemeError

_EMPTY = np.iinfo(np.int64).min


class PartitionTable:
    """Newest minibatch gradient per partition, and the model version it was computed at.

    A newer version replaces an older one; an equal or older one is ignored. The master may
    step at `step` when every partition has an entry of age step - version < window.
    """

    def __init__(self, n: int, window: int, dim: int, dtype: np.dtype | type = np.float64):
        self.n, self.window = n, window
        self.grads = np.zeros((n, dim), dtype=dtype)
        self.versions = np.full(n, _EMPTY, dtype=np.int64)

    def offer(self, partition: int, version: int, grad: np.ndarray | Callable[[], np.ndarray]) -> bool:
        """Store `grad` for `partition` if it is newer than the entry; returns whether it was. `grad`
        may be a callable that computes it, called only then (the simulator's lazy gradients)."""
        if not 0 <= partition < self.n:
            raise SchemeError(f"partition {partition} is outside 0..{self.n - 1}")
        if version <= self.versions[partition]:
            return False
        self.grads[partition] = grad() if callable(grad) else grad
        self.versions[partition] = version
        return True

    def missing(self, step: int) -> list[int]:
        """Partitions without an entry younger than the window at `step`."""
        return [int(j) for j in np.flatnonzero(~self._fresh(step))]

    def ready(self, step: int) -> bool:
        """Whether every partition has an entry younger than the window at `step`."""
        return bool(self._fresh(step).all())

    def ages(self, step: int) -> np.ndarray:
        """step - version per partition (entries never filled are reported as -1)."""
        return np.where(self.versions == _EMPTY, -1, step - self.versions)

    def filled_versions(self) -> list[int]:
        """The versions of the entries that hold a gradient."""
        return [int(v) for v in self.versions if v != _EMPTY]

    def mean(self, out: np.ndarray | None = None) -> np.ndarray:
        """(1/n) sum_j table[j]: the gradient estimate the master steps with."""
        return np.mean(self.grads, axis=0, out=out)

    def _fresh(self, step: int) -> np.ndarray:
        return (self.versions != _EMPTY) & (step - self.versions < self.window)
