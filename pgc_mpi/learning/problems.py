"""Training problems with per-partition minibatch gradients, as the simulator and workers see them.

A problem is anything with: `dim`, `initial_params()`, `grad(w, partition, draw)` (the mean-loss
gradient of that partition's `draw`-th minibatch at w), `loss_and_grad` (that minibatch's loss
too), `loss(w)` (the full training objective), `evaluate(w)` (a dict of metrics),
`probe_grad(w)` (the gradient on one fixed validation minibatch, for pbs's diagnostics) and
`optimum` (F*, or None when unknown). The numpy problems here are convex with a known optimum
and a held-out validation set drawn from the same distribution; torch models implement the same
protocol (models.py). LeastSquares and Logistic hold a samples x dim data matrix; Quadratic has
none (memory and cost per gradient O(dim)), for runs with many ranks or millions of parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import numpy as np

from ..core.sampling import minibatch_positions, partition_indices
from ..errors import ConfigError


class Problem(Protocol):
    """The interface the simulator and the MPI workers compute gradients through."""

    dim: int
    optimum: float | None

    def initial_params(self) -> np.ndarray: ...

    def grad(self, w: np.ndarray, partition: int, draw: int) -> np.ndarray: ...

    def loss_and_grad(self, w: np.ndarray, partition: int, draw: int) -> tuple[float, np.ndarray]: ...

    def loss(self, w: np.ndarray) -> float: ...

    def evaluate(self, w: np.ndarray) -> dict[str, float]: ...

    def probe_grad(self, w: np.ndarray) -> np.ndarray: ...


def loss_key(metrics: Mapping[str, float]) -> str:
    """The loss a target loss is checked against: the training loss, or the test loss where the
    evaluation has none (a torch problem evaluated without its training split)."""
    return "train_loss" if "train_loss" in metrics else "test_loss"


# The accuracy a target accuracy is checked against, in this order: held-out data first (a torch
# problem's test split, a synthetic logistic problem's validation set), the training split otherwise.
ACCURACY_KEYS = ("test_accuracy", "val_accuracy", "train_accuracy")


def accuracy_key(metrics: Mapping[str, float]) -> str | None:
    """The accuracy a target accuracy is checked against (None: the evaluation has no accuracy)."""
    return next((key for key in ACCURACY_KEYS if key in metrics), None)


class _ConvexProblem:
    """A data matrix split into n partitions, with minibatches drawn per partition, and a
    validation set (`X_val`, `y_val`) from the same distribution, never trained on."""

    X_val: np.ndarray
    y_val: np.ndarray

    def __init__(self, X: np.ndarray, y: np.ndarray, n: int, batch_size: int | None, seed: int):
        self.X, self.y = X, y
        self.dim = X.shape[1]
        self.batch_size, self.seed = batch_size, seed
        self.partitions = partition_indices(len(y), n, seed)
        self.optimum: float | None = None

    def initial_params(self) -> np.ndarray:
        return np.zeros(self.dim)

    def grad(self, w: np.ndarray, partition: int, draw: int) -> np.ndarray:
        X, y = self._batch(partition, draw)
        return self._grad(w, X, y)

    def loss_and_grad(self, w: np.ndarray, partition: int, draw: int) -> tuple[float, np.ndarray]:
        X, y = self._batch(partition, draw)
        return self._loss(w, X, y), self._grad(w, X, y)

    def _batch(self, partition: int, draw: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self.partitions[partition]
        rows = rows[minibatch_positions(len(rows), self.batch_size, draw, self.seed, partition)]
        return self.X[rows], self.y[rows]

    def loss(self, w: np.ndarray) -> float:
        return self._loss(w, self.X, self.y)

    def evaluate(self, w: np.ndarray) -> dict[str, float]:
        out = {"train_loss": self.loss(w)}
        if self.optimum is not None:
            out["gap"] = out["train_loss"] - self.optimum
        out["val_loss"] = self._loss(w, self.X_val, self.y_val)
        return out

    def probe_grad(self, w: np.ndarray) -> np.ndarray:
        """The gradient on the first --batch-size validation samples (all of them without one)."""
        rows = slice(0, self.batch_size or len(self.y_val))
        return self._grad(w, self.X_val[rows], self.y_val[rows])

    def _grad(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _loss(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        raise NotImplementedError


class LeastSquares(_ConvexProblem):
    """f(w) = ||Xw - y||^2 / (2m) on seeded Gaussian data; F* from the normal equations."""

    def __init__(self, n: int, samples: int = 600, dim: int = 20, noise: float = 0.1,
                 batch_size: int | None = None, seed: int = 0):
        rng = np.random.default_rng([seed, 0x15])
        X = rng.standard_normal((samples, dim))
        truth = rng.standard_normal(dim)
        y = X @ truth + noise * rng.standard_normal(samples)
        super().__init__(X, y, n, batch_size, seed)
        val = np.random.default_rng([seed, 0x15, 1])  # its own stream: the training data stay as they were
        self.X_val = val.standard_normal((_validation_size(samples), dim))
        self.y_val = self.X_val @ truth + noise * val.standard_normal(len(self.X_val))
        w_star, *_ = np.linalg.lstsq(X, y, rcond=None)
        self.optimum = self.loss(w_star)

    def _grad(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        return X.T @ (X @ w - y) / len(y)

    def _loss(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        r = X @ w - y
        return float(r @ r / (2 * len(y)))


class Logistic(_ConvexProblem):
    """L2-regularized logistic regression on seeded data with labels in {-1, +1}; F* by Newton."""

    def __init__(self, n: int, samples: int = 600, dim: int = 20, reg: float = 1e-3,
                 batch_size: int | None = None, seed: int = 0):
        rng = np.random.default_rng([seed, 0x1061])
        X = rng.standard_normal((samples, dim))
        truth = rng.standard_normal(dim)
        margin = X @ truth + 0.5 * rng.standard_normal(samples)
        y = np.where(margin > 0, 1.0, -1.0)
        self.reg = reg
        super().__init__(X, y, n, batch_size, seed)
        val = np.random.default_rng([seed, 0x1061, 1])
        self.X_val = val.standard_normal((_validation_size(samples), dim))
        self.y_val = np.where(self.X_val @ truth + 0.5 * val.standard_normal(len(self.X_val)) > 0, 1.0, -1.0)
        self.optimum = self.loss(self._newton())

    def _grad(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        z = y * (X @ w)
        return -(X.T @ (y * _sigmoid(-z))) / len(y) + self.reg * w

    def _loss(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        z = y * (X @ w)
        return float(np.mean(np.logaddexp(0.0, -z)) + 0.5 * self.reg * w @ w)

    def evaluate(self, w: np.ndarray) -> dict[str, float]:
        """The training loss and gap, and the validation loss and accuracy (sign of X w)."""
        return {**super().evaluate(w), "val_accuracy": float(np.mean(np.sign(self.X_val @ w) == self.y_val))}

    def _newton(self) -> np.ndarray:
        w = np.zeros(self.dim)
        for _ in range(50):
            g = self._grad(w, self.X, self.y)
            p = _sigmoid(self.X @ w)
            H = (self.X.T * (p * (1 - p))) @ self.X / len(self.y) + self.reg * np.eye(self.dim)
            w -= np.linalg.solve(H, g)
            if np.linalg.norm(g) < 1e-13:
                break
        return w


class Quadratic:
    """f(w) = 1/2 sum_j h_j (w_j - t_j)^2, matrix-free: F* = 0 exactly, at w = t.

    The curvatures h_j are log-uniform in [0.1, 1] (condition number up to 10) and the target t_j
    standard normal, both seeded; they repeat with a period of PERIOD coordinates (beyond it the
    problem stores nothing more: a rank holds 1 MiB of it whatever dim is, and the coordinates
    are independent, so the repetition does not change what training does). Every gradient is
    computed chunk by chunk in float64 and returned in the dtype of w.

    Samples are virtual: `samples` of them, split into n partitions of sizes differing by at
    most 1, as the other problems' are. Sample i's loss is f(w) + z_i . (w - t), with per-sample
    gradient noise z_i ~ N(0, I) centred over the training set, so f is the mean sample loss. A
    minibatch of b samples of a partition of m is modelled by its mean noise: the `draw`-th
    minibatch's loss is f(w) + z . (w - t), its gradient h * (w - t) + z, where z is normal
    with variance (m - b) / (b (m - 1)) per coordinate (a mean of b of m drawn without
    replacement; zero for a whole partition, without batch_size) and is seeded by (seed,
    partition, draw): every rank computes the same gradient for the same minibatch. Every
    partition has the same expected gradient (no data heterogeneity).

    evaluate: train_loss = f(w), gap = f(w) - F* = f(w), and val_loss, the mean loss of
    _validation_size(samples) = V held-out samples: f(w) + z_val . (w - t) with z_val ~ N(0,
    I / V), seeded (a slight overfit: its own minimum is below 0, and f's minimizer t has
    val_loss 0). probe_grad: the gradient of the mean loss of the first min(batch_size, V) of
    them (noise N(0, I / k), its own seeded draw; all V, val_loss's own, without batch_size).
    """

    PERIOD = 1 << 16

    def __init__(self, n: int, samples: int = 600, dim: int = 20, batch_size: int | None = None, seed: int = 0):
        if samples < n:
            raise ConfigError(f"the problem has {samples} training samples, fewer than the {n} partitions (one per "
                              f"worker): use fewer workers or more --samples")
        self.dim, self.samples, self.batch_size, self.seed = dim, samples, batch_size, seed
        self.optimum: float | None = 0.0
        rng = np.random.default_rng([seed, 0x9AD])
        period = min(dim, self.PERIOD)
        self._h = 10.0 ** rng.uniform(-1.0, 0.0, period)
        self._t = rng.standard_normal(period)
        sizes = [samples // n + (p < samples % n) for p in range(n)]  # np.array_split's sizes
        self._noise = [_minibatch_noise(m, batch_size) for m in sizes]
        self._held_out = _validation_size(samples)

    def initial_params(self) -> np.ndarray:
        return np.zeros(self.dim)

    def grad(self, w: np.ndarray, partition: int, draw: int) -> np.ndarray:
        return self.loss_and_grad(w, partition, draw)[1]

    def loss_and_grad(self, w: np.ndarray, partition: int, draw: int) -> tuple[float, np.ndarray]:
        sd = self._noise[partition]
        rng = np.random.default_rng([self.seed, 0x9AD, 1, partition, draw]) if sd else None
        return self._pass(w, sd, rng, grad=True)

    def loss(self, w: np.ndarray) -> float:
        return self._pass(w, 0.0, None, grad=False)[0]

    def evaluate(self, w: np.ndarray) -> dict[str, float]:
        """The training loss and gap (the same: F* = 0) and the validation loss (see the class)."""
        train, val = self._pass(w, self._held_out ** -0.5, self._held_out_noise(self._held_out), grad=False)
        return {"train_loss": train, "gap": train - 0.0, "val_loss": val}

    def probe_grad(self, w: np.ndarray) -> np.ndarray:
        k = min(self.batch_size or self._held_out, self._held_out)
        return self._pass(w, k ** -0.5, self._held_out_noise(k), grad=True)[1]

    def _held_out_noise(self, k: int) -> np.random.Generator:
        """The stream of the mean noise of the first k validation samples."""
        return np.random.default_rng([self.seed, 0x9AD, 2, k])

    def _pass(self, w: np.ndarray, sd: float, rng: np.random.Generator | None,
              grad: bool) -> tuple:
        """One pass over w's chunks: (f(w), gradient) with grad, else (f(w), the noisy loss) (f(w)
        twice without noise). The noise z = sd * rng's normals enters the loss as z . (w - t) and
        the gradient as + z."""
        out = np.empty(self.dim, dtype=w.dtype if w.dtype.kind == "f" else np.float64) if grad else None
        clean = noisy = 0.0
        for start in range(0, self.dim, len(self._h)):
            stop = min(start + len(self._h), self.dim)
            h, t = self._h[:stop - start], self._t[:stop - start]
            d = w[start:stop] - t  # float64 (t is)
            g = h * d
            part = 0.5 * float(d @ g)
            clean += part
            if rng is not None:
                z = rng.standard_normal(stop - start)
                z *= sd
                part += float(z @ d)
                g += z
            noisy += part
            if out is not None:
                out[start:stop] = g
        return (noisy, out) if grad else (clean, noisy)


class FirstMinibatch:
    """A problem whose every computation of a partition uses that partition's first minibatch
    (draw 0), as the authors' published code did: it re-created each partition's data loader at
    every step without shuffling (--fixed-minibatch, to test whether a result depends on that).
    Everything else is the wrapped problem's."""

    def __init__(self, problem: Problem):
        self.inner = problem

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def grad(self, w: np.ndarray, partition: int, draw: int) -> np.ndarray:
        return self.inner.grad(w, partition, 0)

    def loss_and_grad(self, w: np.ndarray, partition: int, draw: int) -> tuple[float, np.ndarray]:
        return self.inner.loss_and_grad(w, partition, 0)

    def minibatch_loss(self, partition: int, draw: int, **kwargs):
        """TorchProblem's minibatch loss (the ddp baseline), of the first minibatch."""
        return self.inner.minibatch_loss(partition, 0, **kwargs)

    def expect(self, draws: Iterable[tuple[int, int]]) -> None:
        """The minibatches computed next (expect_draws): each partition's first."""
        expect_draws(self.inner, ((partition, 0) for partition, _ in draws))


class Accumulated:
    """--accumulate K: a partition's `draw`-th gradient is the mean over K micro-batches, the
    wrapped problem's draws K*draw .. K*draw + K-1 of that partition, summed in that order: a
    larger minibatch at one micro-batch's memory, and every holder of the partition computes the
    same bits (decoding stays exact). The loss is the mean of the micro-batches' losses. Everything
    else is the wrapped problem's."""

    def __init__(self, problem: Problem, micro_batches: int):
        self.inner, self.micro_batches = problem, micro_batches

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def grad(self, w: np.ndarray, partition: int, draw: int) -> np.ndarray:
        return self.loss_and_grad(w, partition, draw)[1]

    def expect(self, draws: Iterable[tuple[int, int]]) -> None:
        """The minibatches computed next (expect_draws): each draw's K micro-batches, in order."""
        k = self.micro_batches
        expect_draws(self.inner, ((partition, k * draw + j) for partition, draw in draws for j in range(k)))

    def loss_and_grad(self, w: np.ndarray, partition: int, draw: int, check: Callable[[int], None] | None = None,
                      stop: Callable[[int], bool] | None = None) -> tuple[float, np.ndarray]:
        """Two hooks, each called after j micro-batches (0 < j < K): `check(j)` may raise (a check
        point of --abandon-late), and a true `stop(j)` stops there (--drop-compute): the gradient is
        then the sum of the j micro-batches' over K, the loss their mean."""
        k = self.micro_batches
        loss, total = self.inner.loss_and_grad(w, partition, k * draw)
        done = 1
        while done < k:
            if check is not None:
                check(done)
            if stop is not None and stop(done):
                break
            more, grad = self.inner.loss_and_grad(w, partition, k * draw + done)
            loss += more
            total += grad
            done += 1
        total /= k
        return loss / done, total


def expect_draws(problem: Problem, draws: Iterable[tuple[int, int]]) -> None:
    """Tell `problem` which (partition, draw) minibatches it computes next, in order, so that
    a torch problem with loaders reads them ahead (pgc_mpi.learning.minibatches); a problem that
    loads nothing (the NumPy ones) ignores it."""
    expect = getattr(problem, "expect", None)
    if expect is not None:
        expect(draws)


def take_data_wait(problem: Problem) -> float:
    """Seconds `problem` spent getting minibatches since the last call (0 for the NumPy problems:
    their minibatches are rows they hold, picked as they compute)."""
    minibatches = getattr(problem, "minibatches", None)
    return minibatches.take_data_wait() if minibatches is not None else 0.0


def with_sampling(problem: Problem, fixed_minibatch: bool, accumulate: int = 1) -> Problem:
    """The problem as --fixed-minibatch and --accumulate ask: unchanged, FirstMinibatch, Accumulated."""
    problem = FirstMinibatch(problem) if fixed_minibatch else problem
    return Accumulated(problem, accumulate) if accumulate > 1 else problem


def _minibatch_noise(size: int, batch_size: int | None) -> float:
    """The standard deviation of the mean of batch_size of `size` unit-variance values drawn
    without replacement (0 for the whole partition)."""
    if batch_size is None or batch_size >= size:
        return 0.0
    return float(np.sqrt((size - batch_size) / (batch_size * (size - 1))))


def _validation_size(samples: int) -> int:
    """Validation samples beside `samples` training ones: a fifth as many (at least 20)."""
    return max(20, samples // 5)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


PROBLEMS = {"least-squares": LeastSquares, "logistic": Logistic, "quadratic": Quadratic}
