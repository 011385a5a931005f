"""Regression with your own metrics: an MLP on scikit-learn's diabetes data, pgc-fr (s=1), 4 workers.

    mpiexec -n 5 python examples/regression_metric.py [pgc-train flags]

Floating-point targets make it a regression (default loss: half the mean squared error); the
metrics are computed over each whole split at every evaluation and recorded as test_mae,
test_r2 (and train_...) in metrics.jsonl.
"""

import numpy as np
from sklearn.datasets import load_diabetes
from torch import nn

import pgc_mpi


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))


def mae(output, target) -> float:
    return float((output.squeeze(1) - target).abs().mean())


def r2(output, target) -> float:
    residual = ((output.squeeze(1) - target) ** 2).sum()
    return float(1 - residual / ((target - target.mean()) ** 2).sum())


x, y = load_diabetes(return_X_y=True)
x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
y = ((y - y.mean()) / y.std()).astype(np.float32)  # standardized targets
options = pgc_mpi.options_from_args(scheme="pgc-fr", stragglers=1, steps=300, lr=0.1, batch_size=16,
                                    out="runs/regression")
result = pgc_mpi.fit(make_model, (x[:350], y[:350]), test_data=(x[350:], y[350:]), metrics=[mae, r2], **options)
if result is not None:
    print(f"test MAE {result.summary['final_test_mae']:.3f}, R2 {result.summary['final_test_r2']:.3f}")
