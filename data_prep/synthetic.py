"""Seeded synthetic data sets of any size: convex (least squares, logistic) and non-convex."""

from __future__ import annotations

import numpy as np

KINDS = ("least-squares", "logistic", "nonconvex")


def make_synthetic(kind: str, samples: int, features: int, classes: int, seed: int,
                   noise: float = 0.1) -> tuple[np.ndarray, np.ndarray, int, str]:
    """(x [samples, features], y, num_classes, task).

    least-squares: y = x w + noise (regression); logistic: y = [x w + noise > 0] (2 classes);
    nonconvex: y = argmax of a random two-layer tanh network's outputs (`classes` classes).
    """
    rng = np.random.default_rng([seed, 0x5E7])
    x = rng.standard_normal((samples, features)).astype(np.float32)
    if kind == "least-squares":
        y = x @ rng.standard_normal(features) + noise * rng.standard_normal(samples)
        return x, y.astype(np.float32), 1, "regression"
    if kind == "logistic":
        margin = x @ rng.standard_normal(features) + noise * rng.standard_normal(samples)
        return x, (margin > 0).astype(np.int64), 2, "classification"
    hidden = np.tanh(x @ rng.standard_normal((features, 32)) * (2.0 / np.sqrt(features)))
    logits = hidden @ rng.standard_normal((32, classes)) + noise * rng.standard_normal((samples, classes))
    return x, logits.argmax(axis=1).astype(np.int64), classes, "classification"
