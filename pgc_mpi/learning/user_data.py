"""Training data a user brings: NumPy arrays `(x, y)` and map-style torch Datasets.

Both are sources with the interface of pgc_mpi.learning.datasets (`info`, `read_train(rows)`,
`read_split(split)`), so partitions and minibatches stay the pure functions of
pgc_mpi.core.sampling: two holders of a partition compute on the same rows.

Arrays are held in memory as they are given (a worker keeps the rows of its own partitions).
A Dataset is read *lazily*, one minibatch at a time (`lazy = True`): a worker calls
`__getitem__` only for the rows of its current minibatch, as a torch DataLoader would, so a data
set larger than memory works and a transform runs on every read. TorchProblem seeds torch's
random generator from (seed, partition, draw) before each minibatch, so a random transform (and
dropout) draws the same on every holder of a partition, which exact decoding needs.

Targets decide the task: integer labels are classification (classes 0..K-1), floating-point
targets regression. A missing test set (None) means evaluations on the training data only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from ..errors import ConfigError
from .datasets import ArraySource, DataInfo

Arrays = tuple[Any, Any]
# Rows read from a Dataset per __getitem__ batch when a whole split is read (evaluations)
READ_CHUNK = 1024


def _numpy(value: Any, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - anything np.asarray cannot take
        raise ConfigError(f"{what} is not an array ({type(value).__name__}: {exc})") from None


def _task(y: np.ndarray | torch.Tensor) -> str:
    floating = y.is_floating_point() if isinstance(y, torch.Tensor) else np.issubdtype(y.dtype, np.floating)
    return "regression" if floating else "classification"


def check_arrays(pair: object, what: str) -> tuple[np.ndarray, np.ndarray]:
    """`(x, y)` as NumPy arrays, checked: same length, at least one sample, numbers, finite
    features, labels >= 0 for classification (ConfigError naming `what` otherwise)."""
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise ConfigError(f"{what} must be a pair (x, y) of arrays or a torch Dataset, got {type(pair).__name__}")
    x, y = _numpy(pair[0], f"{what}'s x"), _numpy(pair[1], f"{what}'s y")
    if x.ndim < 1 or y.ndim < 1 or len(x) != len(y):
        raise ConfigError(f"{what}: x and y must have one row per sample, got shapes {list(x.shape)} and "
                          f"{list(y.shape)}")
    if len(x) == 0:
        raise ConfigError(f"{what} has no samples")
    for name, a in (("x", x), ("y", y)):
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise ConfigError(f"{what}'s {name} must hold numbers, got dtype {a.dtype}")
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise ConfigError(f"{what}'s x holds NaN or infinite values")
    if _task(y) == "classification" and y.min() < 0:
        raise ConfigError(f"{what}'s y holds negative labels ({int(y.min())}): classes are 0..K-1 (use "
                          f"floating-point targets for regression)")
    return x, y


def array_source(train: object, test: object | None, name: str = "arrays") -> ArraySource:
    """A source over arrays held in memory: `train` and `test` are `(x, y)` pairs (test may be None)."""
    x, y = check_arrays(train, "train_data")
    test_xy = check_arrays(test, "test_data") if test is not None else (x[:0], y[:0])
    _same_kind(x, y, *test_xy)
    task = _task(y)
    classes = int(max(y.max(), test_xy[1].max(initial=0))) + 1 if task == "classification" else 0
    info = DataInfo(name, task, classes, tuple(x.shape[1:]), len(y), len(test_xy[1]), "arrays given in Python")
    return ArraySource(info, (x, y), test_xy)


def _same_kind(x, y, tx, ty) -> None:
    if len(ty) and (tuple(x.shape[1:]) != tuple(tx.shape[1:]) or _task(y) != _task(ty)):
        raise ConfigError(f"test_data does not match train_data: samples {list(tx.shape[1:])} vs "
                          f"{list(x.shape[1:])}, targets {_task(ty)} vs {_task(y)}")


class DatasetSource:
    """A source over map-style torch Datasets (`__len__`, `__getitem__` giving `(x, y)`), batched by
    `collate_fn` (torch's default_collate unless given). Read a minibatch at a time (lazy)."""

    lazy = True

    def __init__(self, train: Dataset, test: Dataset | None, collate_fn: Callable | None = None,
                 name: str = "dataset"):
        self._train, self._test = train, test
        self.collate = default_collate if collate_fn is None else collate_fn
        for what, ds in (("train_data", train), ("test_data", test)):
            if ds is not None and not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
                raise ConfigError(f"{what} ({type(ds).__name__}) is neither a pair (x, y) of arrays nor a map-style "
                                  f"Dataset (it needs __len__ and __getitem__)")
        if len(train) == 0:
            raise ConfigError("train_data has no samples")
        x, y = self._rows(train, [0], "train_data")
        task = _task(y)
        if test is not None and len(test):
            tx, ty = self._rows(test, [0], "test_data")
            _same_kind(x, y, tx, ty)
        classes = len(train.classes) if task == "classification" and hasattr(train, "classes") else 0
        self.info = DataInfo(name, task, classes, tuple(x.shape[1:]), len(train), len(test) if test is not None else 0,
                             f"torch Dataset {type(train).__name__}")

    def _rows(self, ds: Dataset, rows: Sequence[int], what: str = "train_data") -> tuple[torch.Tensor, torch.Tensor]:
        try:
            batch = self.collate([ds[int(i)] for i in rows])
        except Exception as exc:  # noqa: BLE001 - the user's __getitem__, transform or collate
            text = str(exc).strip().splitlines()
            raise ConfigError(f"{what}: reading samples {list(rows[:3])}{'...' if len(rows) > 3 else ''} failed: "
                              f"{type(exc).__name__}: {text[0] if text else ''}") from None
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise ConfigError(f"{what}: a batch must be a pair (x, y); __getitem__ and collate_fn gave "
                              f"{type(batch).__name__}")
        return torch.as_tensor(batch[0]), torch.as_tensor(batch[1])

    def read_train(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and targets of the given training rows, batched."""
        return self._rows(self._train, np.asarray(rows).tolist())

    def read_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole split ('train' or 'test'), read in chunks of READ_CHUNK rows."""
        ds = self._train if split == "train" else self._test
        size = 0 if ds is None else len(ds)
        parts = [self._rows(ds, range(start, min(start + READ_CHUNK, size)), f"{split}_data")
                 for start in range(0, size, READ_CHUNK)]
        if not parts:
            x, y = self.read_train([0])
            return x[:0], y[:0]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def fingerprint(self) -> dict[str, str | None]:
        """The fingerprints of the training and test Datasets (pgc_mpi.learning.fingerprint: their lengths and
        a fixed sample of their items; test None without one)."""
        from .fingerprint import dataset_fingerprint

        return {"train": dataset_fingerprint(self._train, "train_data"),
                "test": dataset_fingerprint(self._test, "test_data") if self._test is not None else None}

    def train_labels(self) -> np.ndarray:
        """Every training label, in row order (--partitioning by class): the Dataset's `targets` where it
        has them (torchvision's), else one pass over the training data."""
        targets = getattr(self._train, "targets", None)
        if targets is not None and len(targets) == len(self._train):
            return np.asarray(targets)
        return self.read_split("train")[1].numpy()

    def count_classes(self) -> int:
        """Classes 0..K-1 of a classification set without `classes`: one pass over every label."""
        y = torch.cat([self.read_split("train")[1]] + ([self.read_split("test")[1]] if self._test is not None else []))
        classes = int(y.max()) + 1
        self.info = dataclasses.replace(self.info, num_classes=classes)
        return classes


def source_of(train: object, test: object | None = None, collate_fn: Callable | None = None,
              name: str | None = None) -> ArraySource | DatasetSource:
    """The source of `train` (and `test`): two (x, y) pairs, or two map-style Datasets."""
    if isinstance(train, (tuple, list)) and not isinstance(train, Dataset):
        if collate_fn is not None:
            raise ConfigError("collate_fn applies to a torch Dataset, not to arrays (x, y)")
        if test is not None and not isinstance(test, (tuple, list)):
            raise ConfigError(f"test_data must be of the same kind as train_data (arrays (x, y)), got "
                              f"{type(test).__name__}")
        return array_source(train, test, name or "arrays")
    if isinstance(test, (tuple, list)):
        raise ConfigError("test_data must be of the same kind as train_data (a torch Dataset), got a pair of arrays")
    return DatasetSource(train, test, collate_fn, name or type(train).__name__)
