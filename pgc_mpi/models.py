"""Torch models on one flat parameter buffer, and the classification problem workers compute.

FlatParams rebinds every parameter of an nn.Module (and its .grad) to views of one contiguous
buffer, so the parameters a worker receives over MPI and the gradient it sends are plain NumPy
views: no per-step flattening. Any nn.Module without buffers works; see TorchClassifier.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .datasets import Dataset
from .errors import ConfigError
from .sampling import minibatch_positions, partition_indices

MODELS = ("logreg", "mlp")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def build_model(name: str, sample_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A fresh (unseeded) model by name for inputs of `sample_shape` and `num_classes` classes."""
    features = int(np.prod(sample_shape))
    if name == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(features, num_classes))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(features, 128), nn.ReLU(), nn.Linear(128, num_classes))
    raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")


class FlatParams:
    """A module's parameters and gradients as views into one contiguous buffer each."""

    def __init__(self, module: nn.Module, dtype: torch.dtype):
        if any(True for _ in module.buffers()):
            raise ConfigError("models with buffers (e.g. batch norm statistics) are not supported yet")
        module.to(dtype)
        params = list(module.parameters())
        self.dim = sum(p.numel() for p in params)
        self.flat = torch.empty(self.dim, dtype=dtype)
        self.flat_grad = torch.zeros(self.dim, dtype=dtype)
        offset = 0
        for p in params:
            size = p.numel()
            self.flat[offset:offset + size].copy_(p.data.reshape(-1))
            p.data = self.flat[offset:offset + size].view_as(p)
            p.grad = self.flat_grad[offset:offset + size].view_as(p)
            offset += size
        self._params = params
        self.values: np.ndarray = self.flat.numpy()
        self.grads: np.ndarray = self.flat_grad.numpy()

    def check_views(self) -> None:
        """Fail loudly if autograd replaced a .grad instead of accumulating into our buffer."""
        base = self.flat_grad.data_ptr()
        end = base + self.dim * self.flat_grad.element_size()
        if any(p.grad is None or not base <= p.grad.data_ptr() < end for p in self._params):
            raise RuntimeError("a parameter's .grad no longer views the flat gradient buffer")


class TorchClassifier:
    """Cross-entropy classification with a torch model: the Problem protocol of problems.py."""

    optimum = None

    def __init__(self, model: str | nn.Module, data: Dataset, n: int, batch_size: int | None,
                 seed: int = 0, dtype: str = "float32"):
        if dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        torch.manual_seed(seed)
        module = build_model(model, data.sample_shape, data.num_classes) if isinstance(model, str) else model
        self.module = module
        self.flat = FlatParams(module, DTYPES[dtype])
        self.dim = self.flat.dim
        self.data, self.batch_size, self.seed = data, batch_size, seed
        self.partitions = partition_indices(len(data.y_train), n, seed)
        self._x_train = torch.from_numpy(data.x_train).to(DTYPES[dtype])
        self._y_train = torch.from_numpy(data.y_train)
        self._x_test = torch.from_numpy(data.x_test).to(DTYPES[dtype])
        self._y_test = torch.from_numpy(data.y_test)
        self._initial = self.flat.values.copy()

    def initial_params(self) -> np.ndarray:
        """The seeded initial parameters (a copy)."""
        return self._initial.copy()

    def loss_and_grad(self, w: np.ndarray, partition: int, draw: int) -> tuple[float, np.ndarray]:
        """Mean cross-entropy of the partition's `draw`-th minibatch at w, and its gradient (a copy)."""
        rows = self.partitions[partition]
        rows = torch.from_numpy(rows[minibatch_positions(len(rows), self.batch_size, draw, self.seed, partition)])
        self._load(w)
        self.flat.flat_grad.zero_()
        loss = nn.functional.cross_entropy(self.module(self._x_train[rows]), self._y_train[rows])
        loss.backward()
        self.flat.check_views()
        return float(loss.detach()), self.flat.grads.copy()

    def grad(self, w: np.ndarray, partition: int, draw: int) -> np.ndarray:
        """The gradient of loss_and_grad."""
        return self.loss_and_grad(w, partition, draw)[1]

    @torch.no_grad()
    def _mean_loss_accuracy(self, x: torch.Tensor, y: torch.Tensor, batch: int = 2048) -> tuple[float, float]:
        total, correct = 0.0, 0
        for start in range(0, len(y), batch):
            out = self.module(x[start:start + batch])
            total += float(nn.functional.cross_entropy(out, y[start:start + batch], reduction="sum"))
            correct += int((out.argmax(dim=1) == y[start:start + batch]).sum())
        return total / len(y), correct / len(y)

    def loss(self, w: np.ndarray) -> float:
        """Mean training loss over every training sample."""
        self._load(w)
        return self._mean_loss_accuracy(self._x_train, self._y_train)[0]

    def evaluate(self, w: np.ndarray) -> dict[str, float]:
        """Full training loss and accuracy, and test loss and accuracy, over every sample."""
        self._load(w)
        train_loss, train_acc = self._mean_loss_accuracy(self._x_train, self._y_train)
        test_loss, test_acc = self._mean_loss_accuracy(self._x_test, self._y_test)
        return {"train_loss": train_loss, "train_accuracy": train_acc, "test_loss": test_loss,
                "test_accuracy": test_acc}

    def _load(self, w: np.ndarray) -> None:
        if w is not self.flat.values:
            np.copyto(self.flat.values, w, casting="same_kind")
