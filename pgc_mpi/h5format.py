"""pgc-mpi's HDF5 layout for a data set: writing it atomically, and checking a file against it.

Layout (format_version 1):

    /train/x   float32 [N_train, *sample_shape]   features, already normalized
    /train/y   int64 [N_train] class labels 0..num_classes-1   (float32 targets for regression)
    /test/x    float32 [N_test, *sample_shape]
    /test/y    like /train/y
    root attributes:
      format_version  1
      name            data set name, e.g. "fashion-mnist"
      task            "classification" or "regression"
      num_classes     number of classes (1 for regression)
      sample_shape    shape of one sample, e.g. [1, 28, 28]
      source          where the data came from (file names, generator and seed)
      normalization   JSON: how raw values were turned into the stored features
      checksum        sha256 over train/x, train/y, test/x, test/y bytes, in that order

Files are written to a temporary name next to the target, flushed and fsynced, then renamed,
so a crash or a bad input never leaves a partial file under the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .errors import PgcError

FORMAT_VERSION = 1
SPLITS = ("train", "test")
TASKS = ("classification", "regression")


class DataFormatError(PgcError):
    """A data file that is missing, unreadable or not in pgc-mpi's HDF5 layout."""


@contextmanager
def atomic_h5(path: Path) -> Iterator[Any]:
    """An h5py.File open for writing under a temporary name next to `path`. On success it is
    flushed, fsynced and renamed to `path`; on any error the temporary file is removed, so no
    partial file ever carries the final name."""
    import h5py

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            yield f
            f.flush()
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def checksum(arrays: list[np.ndarray]) -> str:
    """sha256 of the arrays' bytes (C order), in the given order."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def write_dataset(path: Path, name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                  num_classes: int, source: str, normalization: dict[str, Any], task: str = "classification") -> Path:
    """Write a data set in the layout above, atomically; returns the path."""
    path = Path(path)
    label_dtype = np.int64 if task == "classification" else np.float32
    arrays = {}
    for split, (x, y) in zip(SPLITS, (train, test)):
        if len(x) != len(y):
            raise DataFormatError(f"{split} split has {len(x)} samples but {len(y)} labels")
        arrays[split] = (np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=label_dtype))
    if task == "classification":
        for split, (_, y) in arrays.items():
            if len(y) and (y.min() < 0 or y.max() >= num_classes):
                raise DataFormatError(f"{split} labels lie outside 0..{num_classes - 1}")
    digest = checksum([a for pair in arrays.values() for a in pair])
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_h5(path) as f:
        for split, (x, y) in arrays.items():
            group = f.create_group(split)
            group.create_dataset("x", data=x, chunks=_chunks(x))
            group.create_dataset("y", data=y)
        f.attrs.update({
            "format_version": FORMAT_VERSION, "name": name, "task": task, "num_classes": num_classes,
            "sample_shape": np.asarray(arrays["train"][0].shape[1:], dtype=np.int64), "source": source,
            "normalization": json.dumps(normalization), "checksum": digest,
        })
    return path


def _chunks(x: np.ndarray) -> tuple[int, ...] | None:
    """Chunks of about 1 MiB of whole samples, so a partition's rows read in few chunks."""
    if len(x) == 0:
        return None
    per_sample = max(1, x[0].nbytes)
    rows = int(max(1, min(len(x), (1 << 20) // per_sample)))
    return (rows, *x.shape[1:])


def open_checked(path: Path):
    """Open a data file read-only and check its layout (not its checksum); returns the h5py.File."""
    import h5py

    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"{path}: no such data file")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise DataFormatError(f"{path}: not a readable HDF5 file ({exc})") from None
    try:
        _check_layout(path, f)
    except DataFormatError:
        f.close()
        raise
    return f


def _check_layout(path: Path, f) -> None:
    missing = [k for k in ("format_version", "name", "task", "num_classes", "sample_shape") if k not in f.attrs]
    if missing:
        raise DataFormatError(f"{path}: missing attributes {missing}; convert the data with `python -m data_prep`")
    if int(f.attrs["format_version"]) != FORMAT_VERSION:
        raise DataFormatError(f"{path}: format_version {f.attrs['format_version']} is not {FORMAT_VERSION}")
    task = str(f.attrs["task"])
    if task not in TASKS:
        raise DataFormatError(f"{path}: task {task!r} is not one of {', '.join(TASKS)}")
    shape = tuple(int(v) for v in f.attrs["sample_shape"])
    for split in SPLITS:
        if split not in f or "x" not in f[split] or "y" not in f[split]:
            raise DataFormatError(f"{path}: missing the {split!r} split (/{split}/x and /{split}/y)")
        x, y = f[split]["x"], f[split]["y"]
        if x.dtype != np.float32 or x.shape[1:] != shape:
            raise DataFormatError(f"{path}: /{split}/x must be float32 of shape [N, {', '.join(map(str, shape))}], "
                                  f"got {x.dtype} {x.shape}")
        want = np.int64 if task == "classification" else np.float32
        if y.dtype != want or y.ndim != 1 or len(y) != len(x):
            raise DataFormatError(f"{path}: /{split}/y must be {np.dtype(want)} of shape [{len(x)}], "
                                  f"got {y.dtype} {y.shape}")


def verify_checksum(path: Path) -> str:
    """Recompute the checksum of a data file and compare it with the stored one; returns it."""
    with open_checked(path) as f:
        arrays = [f[s][k][...] for s in SPLITS for k in ("x", "y")]
        stored = str(f.attrs.get("checksum", ""))
    digest = checksum(arrays)
    if digest != stored:
        raise DataFormatError(f"{path}: checksum mismatch (stored {stored[:12]}..., content {digest[:12]}...): "
                              f"the file is corrupt or was modified; convert it again")
    return digest
