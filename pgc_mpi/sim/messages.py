"""The simulator's messages: the gradients and coded messages a worker would have sent, built
from their versions (and, with --drop-compute, the micro-batches it computed)."""

from __future__ import annotations

import numpy as np

from ..core.drop_compute import stop_after
from ..core.schemes import CodedScheme, PbsScheme
from ..learning.problems import Problem


class MessageBuilder:
    """Builds the gradients and coded messages a worker would have sent, from their versions.

    A buffer of version v for slot k is the gradient of partition placement[i][k] at the model
    of step max(v, 0) on minibatch draw_index(v, k). Gradients and their minibatch losses are
    cached by (partition, version, draw) because the c holders of a partition often compute the
    very same one.
    """

    def __init__(self, scheme: CodedScheme | PbsScheme, problem: Problem):
        self.scheme, self.problem = scheme, problem
        self.models: dict[int, np.ndarray] = {}
        self._cache: dict[tuple[int, int, int], tuple[float, np.ndarray]] = {}

    def add_model(self, version: int, w: np.ndarray) -> None:
        """Keep the parameters of model `version` for gradients computed at it."""
        self.models[version] = w.copy()

    def _computed(self, partition: int, version: int, draw: int) -> tuple[float, np.ndarray]:
        key = (partition, version, draw)
        if key not in self._cache:
            self._cache[key] = self.problem.loss_and_grad(self.models[max(version, 0)], partition, draw)
        return self._cache[key]

    def gradient(self, partition: int, version: int, draw: int) -> np.ndarray:
        """The minibatch gradient of `partition` at model `version` (warm-up versions < 0: model 0)."""
        return self._computed(partition, version, draw)[1]

    def loss(self, partition: int, version: int, draw: int) -> float:
        """That minibatch's loss (the gradient's companion: computed, and cached, together)."""
        return self._computed(partition, version, draw)[0]

    def message_loss(self, worker: int, version: int, slots: tuple[int, ...]) -> float:
        """The loss a worker reports with its message for step `version`: the mean minibatch loss
        of the slots it computed fresh for that step (as worker.py does; catch-up slots excluded)."""
        parts = self.scheme.placement[worker]
        return float(np.mean([self.loss(parts[k], version, self.scheme.draw_index(version, k)) for k in slots]))

    def message(self, worker: int, step: int, versions: list[int]) -> np.ndarray:
        """Worker's coded message for `step`: m_i = sum_k B[i, placement[i][k]] * buffer_k (each term
        weighted by its buffer's age in the rotation under --staleness-correction)."""
        coef = self.scheme.message_coefficients(worker, step)
        parts = self.scheme.placement[worker]
        out = np.zeros(self.problem.dim)
        for k, v in enumerate(versions):
            out += coef[k] * self.gradient(parts[k], v, self.scheme.draw_index(v, k))
        return out

    def dropped(self, worker: int, version: int, done: int) -> tuple[float, np.ndarray]:
        """dgd's (loss, message) when --drop-compute let it compute `done` of its micro-batches: their
        mean loss and their gradients' sum over K (pgc_mpi.core.drop_compute; not cached: no other
        worker computes the same)."""
        part, coef = self.scheme.placement[worker][0], self.scheme.coefficients(worker)[0]
        loss, grad = self.problem.loss_and_grad(self.models[max(version, 0)], part, self.scheme.draw_index(version, 0),
                                                stop=stop_after(done))
        return loss, coef * grad

    def forget_before(self, version: int) -> None:
        """Drop models and gradients older than `version` (no buffer refers to them any more)."""
        for v in [v for v in self.models if v < version]:
            del self.models[v]
        for key in [k for k in self._cache if k[1] < version]:
            del self._cache[key]
