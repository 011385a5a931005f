"""Data sources: the built-in digits set in memory, and HDF5 files read lazily, rows on demand.

`open_dataset("digits")` needs nothing prepared; `open_dataset("path/to/file.h5")` opens a file
written by `python -m data_prep` (layout in h5format.py). A worker reads only the rows of the
partitions it stores; the master reads the test split (and the training split to evaluate on).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..choices import BUILTIN_DATASETS
from ..errors import ConfigError
from .h5format import DataFormatError, open_checked


@dataclass(frozen=True)
class DataInfo:
    """What a data set is: name, task, classes, sample shape and split sizes."""

    name: str
    task: str  # "classification" or "regression"
    num_classes: int
    sample_shape: tuple[int, ...]
    num_train: int
    num_test: int
    source: str


class ArraySource:
    """A data set held in memory (the built-in ones)."""

    def __init__(self, info: DataInfo, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]):
        self.info, self._train, self._test = info, train, test

    def read_train(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Features and labels of the given training rows (sorted indices)."""
        return self._train[0][rows], self._train[1][rows]

    def read_split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """A whole split ('train' or 'test')."""
        return self._train if split == "train" else self._test

    def train_labels(self) -> np.ndarray:
        """Every training label, in row order (--partitioning by class)."""
        return np.asarray(self._train[1])

    def fingerprint(self) -> dict[str, str | None]:
        """The fingerprints of the training and test arrays (pgc_mpi.learning.fingerprint; test None when empty)."""
        from .fingerprint import arrays_fingerprint

        return {"train": arrays_fingerprint(self._train),
                "test": arrays_fingerprint(self._test) if len(self._test[1]) else None}


class H5Source:
    """A data file in pgc-mpi's HDF5 layout, opened read-only and checked (h5check.py): its
    structure, then one streaming pass over its labels, features and, with verify_checksum, its
    checksum. Rows are read on demand afterwards."""

    def __init__(self, path: Path, *, verify_checksum: bool = True):
        self.path = Path(path)
        self._file, checked = open_checked(self.path, verify_checksum=verify_checksum)
        self.info = DataInfo(
            name=checked.name, task=checked.task, num_classes=checked.num_classes,
            sample_shape=checked.sample_shape, num_train=checked.num_train, num_test=checked.num_test,
            source=checked.source,
        )

    def read_train(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Features and labels of the given training rows (sorted, distinct): an h5py selection
        that reads those rows only."""
        rows = np.asarray(rows)
        if len(rows) == 0:
            return (np.zeros((0, *self.info.sample_shape), np.float32),
                    self._file["train"]["y"][:0])
        group = self._file["train"]
        return group["x"][rows], group["y"][rows]

    def read_split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """A whole split ('train' or 'test')."""
        group = self._file[split]
        return group["x"][...], group["y"][...]

    def train_labels(self) -> np.ndarray:
        """Every training label, in row order (--partitioning by class): /train/y only."""
        return self._file["train"]["y"][...]

    def close(self) -> None:
        self._file.close()


def _digits_file() -> Path:
    """scikit-learn's digits.csv.gz, found without importing scikit-learn (that takes seconds)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the built-in 'digits' data set needs scikit-learn installed (pip install scikit-learn)")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 handwritten digits as raw (1797, 1, 8, 8) pixel values 0..16 and labels."""
    table = np.loadtxt(_digits_file(), delimiter=",", dtype=np.float64)
    return table[:, :-1].reshape(-1, 1, 8, 8), table[:, -1].astype(np.int64)


def split_train_test(n: int, seed: int, test_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train and test row indices of a seeded split."""
    perm = np.random.default_rng([seed, 0xD161]).permutation(n)
    cut = n - int(round(test_fraction * n))
    return np.sort(perm[:cut]), np.sort(perm[cut:])


def load_digits(seed: int = 0) -> ArraySource:
    """The built-in default: digits (1797 samples, shipped inside scikit-learn's wheel), pixels
    scaled to 0..1, split 80/20 by a seeded permutation."""
    x, y = digits_arrays()
    x = (x / 16.0).astype(np.float32)
    train, test = split_train_test(len(y), seed)
    info = DataInfo("digits", "classification", 10, (1, 8, 8), len(train), len(test),
                    "scikit-learn datasets/data/digits.csv.gz")
    return ArraySource(info, (x[train], y[train]), (x[test], y[test]))


def open_dataset(spec: str, seed: int = 0, *, verify_checksum: bool = True) -> ArraySource | H5Source:
    """A built-in data set by name ('digits') or an HDF5 file by path, checked when opened (see
    H5Source); verify_checksum=False skips the file's sha256 (labels and values are still checked)."""
    if spec in BUILTIN_DATASETS:
        return load_digits(seed)
    if spec.endswith((".h5", ".hdf5")) or Path(spec).exists():
        try:
            return H5Source(Path(spec), verify_checksum=verify_checksum)
        except DataFormatError as exc:
            raise ConfigError(f"--dataset {exc}") from None
    raise ConfigError(f"--dataset {spec!r} is neither a built-in data set ({', '.join(BUILTIN_DATASETS)}) nor an "
                      f"HDF5 file; convert one with `python -m data_prep`")
