"""pbs's error decomposition: displacement, smoothness, cosine, the bound, --adapt."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pgc_mpi.core.table import PartitionTable
from pgc_mpi.learning.diagnostics import ADAPT_FLOOR, TableDiagnostics
from pgc_mpi.learning.optim import FlatOptimizer
from pgc_mpi.learning.problems import LeastSquares


@pytest.fixture
def lsq():
    return LeastSquares(3, samples=120, dim=4, seed=1)


def test_displacement_is_the_mean_over_the_table_of_the_squared_distance(lsq):
    diag = TableDiagnostics(lsq, probe_every=100, horizon=2)
    table = PartitionTable(3, window=3, dim=4)
    models = {0: np.zeros(4), 1: np.ones(4), 2: np.full(4, 3.0)}
    for v, w in models.items():
        diag.remember(v, w)
    for j, v in enumerate([0, 1, 2]):
        table.offer(j, v, np.full(4, 1.0))
    opt = FlatOptimizer(np.zeros(4))
    out = diag.observe(2, table, np.full(4, 0.5), opt)
    assert out["grad_norm_sq"] == pytest.approx(1.0)
    assert out["displacement"] == pytest.approx((36 + 16 + 0) / 3)  # ||w2 - w_v||^2 for v = 0, 1, 2
    assert out["displaced_entries"] == 3 and "error_bound" not in out  # no probe this step
    # the horizon: models older than 2 steps back from the next step are dropped once unused
    table.offer(0, 3, np.zeros(4))
    diag.remember(3, np.full(4, 3.0))
    diag.observe(3, table, np.ones(4), opt)
    assert sorted(diag.models) == [1, 2, 3]


def test_the_probe_measures_smoothness_cosine_and_the_bound(lsq):
    diag = TableDiagnostics(lsq, probe_every=1, horizon=None)
    old, new = np.zeros(4), np.full(4, 0.1)
    diag.remember(0, old)
    diag.remember(1, new)
    table = PartitionTable(3, window=2, dim=4)
    for j, v in enumerate([0, 1, 1]):
        table.offer(j, v, np.zeros(4))
    out = diag.observe(1, table, np.ones(4), FlatOptimizer(np.zeros(4)))
    g_old, g_new = lsq.probe_grad(old), lsq.probe_grad(new)
    smooth = np.linalg.norm(g_new - g_old) / np.linalg.norm(new - old)
    assert out["smoothness"] == pytest.approx(smooth)
    assert out["stale_cosine"] == pytest.approx(g_new @ g_old / np.linalg.norm(g_new) / np.linalg.norm(g_old))
    assert out["displacement"] == pytest.approx(0.04 / 3)
    assert out["error_bound"] == pytest.approx(smooth**2 * 0.04 / 3)
    # a quadratic's gradient difference is at most its largest curvature times the distance
    hessian = lsq.X_val[: len(lsq.y_val)].T @ lsq.X_val / len(lsq.y_val)
    assert smooth <= np.linalg.eigvalsh(hessian).max() + 1e-9


def test_adapt_halves_the_learning_rate_down_to_its_floor(lsq):
    diag = TableDiagnostics(lsq, probe_every=1, horizon=None, adapt=True)
    opt = FlatOptimizer(np.zeros(4), lr=0.8)
    table = PartitionTable(3, window=2, dim=4)
    lrs = []
    for t in range(10):  # entries from the far-away model 0: the bound dwarfs a tiny gradient
        diag.remember(t, np.full(4, float(t)))
        if t == 0:
            for j in range(3):
                table.offer(j, 0, np.zeros(4))
        out = diag.observe(t, table, np.full(4, 1e-6), opt)
        lrs.append(opt.opt.param_groups[0]["lr"])
        if t > 0:
            assert out["lr"] == lrs[-1]
    assert lrs[:3] == [0.8, 0.4, 0.2]  # step 0: no displacement, no bound
    assert lrs[-1] == pytest.approx(0.8 * ADAPT_FLOOR)
    quiet = TableDiagnostics(lsq, probe_every=1, horizon=None)  # without --adapt the rate never changes
    opt2 = FlatOptimizer(np.zeros(4), lr=0.8)
    quiet.remember(0, np.zeros(4))
    quiet.remember(1, np.ones(4))
    quiet.observe(1, table, np.full(4, 1e-6), opt2)
    assert opt2.opt.param_groups[0]["lr"] == 0.8


def test_problems_have_a_validation_set_and_a_probe_gradient(lsq):
    metrics = lsq.evaluate(np.zeros(4))
    assert set(metrics) == {"train_loss", "gap", "val_loss"} and math.isfinite(metrics["val_loss"])
    assert lsq.probe_grad(np.zeros(4)).shape == (4,)
