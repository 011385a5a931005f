"""Data sets as in-memory arrays: train/test features, integer labels, and their description."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ConfigError

DATASETS = ("digits",)


@dataclass(frozen=True)
class Dataset:
    """A classification data set; features are float32, labels int64 in 0..num_classes-1."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    source: str

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample (e.g. (64,) or (1, 28, 28))."""
        return tuple(self.x_train.shape[1:])


def _digits_file() -> Path:
    """scikit-learn's digits.csv.gz, found without importing scikit-learn (that takes seconds)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the built-in 'digits' data set needs scikit-learn installed (pip install scikit-learn)")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def load_digits(seed: int = 0) -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1797 samples, ships inside its wheel), split 80/20 by a
    seeded permutation. Pixels are scaled from 0..16 to 0..1.
    """
    table = np.loadtxt(_digits_file(), delimiter=",", dtype=np.float64)
    x = (table[:, :-1] / 16.0).astype(np.float32)
    y = table[:, -1].astype(np.int64)
    perm = np.random.default_rng([seed, 0xD161]).permutation(len(y))
    cut = int(0.8 * len(y))
    train, test = perm[:cut], perm[cut:]
    return Dataset("digits", x[train], y[train], x[test], y[test], 10, "scikit-learn datasets/data/digits.csv.gz")


def load_dataset(name: str, seed: int = 0) -> Dataset:
    """A data set by name."""
    if name == "digits":
        return load_digits(seed)
    raise ConfigError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
