"""--accumulate K (pgc_mpi.learning.problems.Accumulated): the mean of K micro-batch draws, the
same bits on every holder of a partition."""

from __future__ import annotations

import numpy as np

from pgc_mpi.learning.problems import Quadratic, with_sampling


def test_a_gradient_is_the_mean_of_k_consecutive_micro_batch_draws():
    inner = Quadratic(4, samples=400, dim=50, batch_size=8, seed=1)
    problem = with_sampling(Quadratic(4, samples=400, dim=50, batch_size=8, seed=1), False, accumulate=3)
    w = np.linspace(-1, 1, 50)
    loss, grad = problem.loss_and_grad(w, 2, 5)
    parts = [inner.loss_and_grad(w, 2, 3 * 5 + j) for j in range(3)]
    np.testing.assert_allclose(grad, sum(g for _, g in parts) / 3, rtol=1e-14)
    assert loss == sum(v for v, _ in parts) / 3
    again = with_sampling(Quadratic(4, samples=400, dim=50, batch_size=8, seed=1), False, accumulate=3)
    assert np.array_equal(again.loss_and_grad(w, 2, 5)[1], grad)  # another holder: the same bits
    assert not np.array_equal(problem.loss_and_grad(w, 2, 6)[1], grad)  # the next draw: other micro-batches
    assert problem.dim == 50 and with_sampling(inner, False) is inner
