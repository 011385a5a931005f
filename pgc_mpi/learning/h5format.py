"""pgc-mpi's HDF5 layout for a data set: writing it atomically, and opening a file checked against
it (the checks themselves are in h5check.py).

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

Files are built in memory, written to a temporary name next to the target and fsynced, then
renamed, so a crash, a full disk or a bad input never leaves a partial file under the final name.

Opening a file checks it before anything trusts it (h5check.py): attributes, links and storage
(only datasets stored in the file itself), declared sizes against memory, then one streaming
pass over the data for labels in 0..num_classes-1, finite values and the checksum (verified by
default: ~0.2 s for 220 MB, measured in h5check.py; open_checked(verify_checksum=False) skips it).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import WriteError, write_failure
from . import h5check
from .h5layout import FORMAT_VERSION, SPLITS, TASKS, DataFormatError

__all__ = ["FORMAT_VERSION", "SPLITS", "TASKS", "DataFormatError", "atomic_h5", "checksum", "open_checked",
           "verify_checksum", "write_dataset"]

# The file is built in memory (HDF5's core driver) and then written with plain os.write calls, so
# a full disk is an ordinary OSError from write() or fsync(). Written through HDF5's own file driver
# instead, a full disk fails inside HDF5 2.0: a failed chunk write surfaces only when the dataset
# object is freed (an "Exception ignored" traceback on stderr), and closing the file after a failed
# flush crashed the process with SIGSEGV (seen on a full tmpfs). The cost: one more copy of the
# file in memory while it is written, and ~0.2 s more per 200 MB.
_CORE_BLOCK = 4 << 20  # the in-memory image grows by this much at a time
_WRITE_MAX = 1 << 30  # bytes per os.write call (Linux writes at most ~2 GiB per call)
USERBLOCK = 512  # bytes of an HDF5 user block (atomic_h5's `userblock`): the smallest HDF5 allows
_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # where an HDF5 superblock begins


@contextmanager
def atomic_h5(path: Path, userblock: Callable[[memoryview], bytes] | None = None) -> Iterator[Any]:
    """An h5py.File open for writing, built in memory; on success its image is written to a
    temporary name next to `path`, fsynced and renamed to `path`. On any error the temporary
    file is removed, so no partial file ever carries the final name, and a failed write (a full
    disk...) is one WriteError naming `path`. `userblock`: a function of the HDF5 image returning
    the USERBLOCK bytes written before it (HDF5's user block, which it skips; a checkpoint's digest)."""
    import h5py

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    f = h5py.File(tmp, "w", driver="core", backing_store=False, block_size=_CORE_BLOCK,
                  userblock_size=USERBLOCK if userblock else 0)
    try:
        yield f
        f.flush()
        image = f.id.get_file_image()
    finally:
        f.close()
    try:
        head = b""
        if userblock is not None:
            image = _after_userblock(image)
            head = userblock(image)
            if len(head) != USERBLOCK:
                raise ValueError(f"a user block of {len(head)} bytes, not {USERBLOCK}")
        _write_durably(tmp, image, head)
        del image
        os.replace(tmp, path)
    except OSError as exc:
        raise WriteError(write_failure(path, exc)) from None
    finally:
        tmp.unlink(missing_ok=True)


def _after_userblock(image: bytes) -> memoryview:
    """The HDF5 image of a file created with a user block, without it: HDF5 2.0's core driver
    leaves the user block out of the image (its addresses are relative to the superblock) but is
    not documented to; either way, what the user block goes before."""
    view = memoryview(image)
    if bytes(view[:8]) == _SIGNATURE:
        return view
    if bytes(view[USERBLOCK:USERBLOCK + 8]) == _SIGNATURE:
        return view[USERBLOCK:]
    raise ValueError("the HDF5 image has no superblock where a user block would end")


def _write_durably(path: Path, data: bytes | memoryview, head: bytes = b"") -> None:
    """Write `head` and `data` as the whole of file `path` and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        for part in (head, data):
            view = memoryview(part)
            while view:
                view = view[os.write(fd, view[:_WRITE_MAX]):]
        os.fsync(fd)  # a full disk may only show here (delayed allocation, NFS)
    finally:
        os.close(fd)


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
    _check_content(path, arrays, num_classes, task)  # never write what the reader refuses
    digest = checksum([a for pair in arrays.values() for a in pair])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(write_failure(path, exc)) from None
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


def _check_content(path: Path, arrays: dict[str, tuple[np.ndarray, np.ndarray]], num_classes: int,
                   task: str) -> None:
    """The reader's limits (h5check) on arrays about to be written."""

    if task == "classification" and not 1 <= num_classes <= h5check.MAX_CLASSES:
        raise DataFormatError(f"{path}: not written: num_classes {num_classes} is outside 1..{h5check.MAX_CLASSES}")
    if task == "regression" and num_classes != 1:
        raise DataFormatError(f"{path}: not written: num_classes must be 1 for regression, got {num_classes}")
    for split, (x, y) in arrays.items():
        for what, a in (("features", x), ("regression targets", y if task == "regression" else x[:0])):
            bad = h5check.first_non_finite(a)
            if bad is not None:
                raise DataFormatError(f"{path}: not written: {split} {what}: [{', '.join(map(str, bad))}] is "
                                      f"{a[bad]} (they must be finite)")
        if task == "classification" and len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise DataFormatError(f"{path}: not written: {split} labels lie outside 0..{num_classes - 1}")


def open_checked(path: Path, *, verify_checksum: bool = True) -> tuple[Any, h5check.Checked]:
    """Open a data file read-only and check it (pgc_mpi.learning.h5check): its attributes and structure,
    then, in one streaming pass, its labels, its features and (unless verify_checksum is False)
    its checksum. Returns the open h5py.File and an h5check.Checked saying what it holds."""
    import h5py


    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"{path}: no such data file")
    if not path.is_file():  # opening a FIFO blocks until someone writes to it: never open one
        raise DataFormatError(f"{path}: not a regular file (a directory, FIFO or device); give an HDF5 file "
                              f"written by `python -m data_prep`")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise DataFormatError(f"{path}: not a readable HDF5 file ({h5check.first_line(exc)})") from None
    try:
        checked = h5check.check_structure(path, f)
        h5check.scan(path, f, checked, verify_checksum=verify_checksum)
    except BaseException:
        f.close()
        raise
    return f, checked


def verify_checksum(path: Path) -> str:
    """Check a data file as open_checked does, its checksum included; returns the checksum."""
    f, checked = open_checked(path, verify_checksum=True)
    f.close()
    return checked.checksum
