"""Checking a data file before anything trusts it: a file can neither hang a job, nor read
files outside itself, nor exhaust memory, nor corrupt a run silently.

Three stages, cheapest first; each refuses with one line naming the file, the problem and what
to do (a DataFormatError):

1. attributes: format_version, task, num_classes, sample_shape... of the right type and range,
   read only after their declared size is known to be small;
2. structure, without reading any data: each object the reader touches (/train, /test and their
   x and y) is a hard link to a group or dataset stored in this file - no external or soft link,
   no external storage, no virtual dataset - with the declared dtype and shape, and the declared
   sizes within limits (memory, chunk size, chunk count);
3. content, in one streaming pass over the four arrays (SCAN_BYTES at a time, into one reused
   buffer): labels are class indices, features (and regression targets) are finite, and the
   sha256 checksum matches (unless the caller skips it).

Cost, measured on a Fashion-MNIST-sized file (70,000 x 784 float32, 221 MB; page cache warm /
evicted): opening took 1 ms before these checks; stages 1-3 without the checksum take 66 / 130
ms, with it 190 / 250 ms (sha256 runs at ~1.8 GB/s), and ~75 MiB of memory (one block). A
training run takes minutes and `import torch` alone 1.4 s, so the checksum is verified by
default; `verify_checksum=False` skips it (labels and values are still checked).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .h5layout import FORMAT_VERSION, SPLITS, TASKS, DataFormatError

# A classifier's output layer has num_classes units; the largest label sets in use (ImageNet-21k's
# 21,841 classes) are far below this, while 10**12 would allocate a last layer of terabytes.
# int64 labels index any count up to this.
MAX_CLASSES = 100_000
# The models take flat (F,) or image (C, H, W) samples; 8 dimensions is a bound on the attribute only.
MAX_SAMPLE_DIMS = 8
# The content pass reads this much at a time into one reused buffer: large enough that h5py's
# per-call overhead vanishes, small next to any machine that trains.
SCAN_BYTES = 64 << 20
# HDF5 decompresses a whole chunk (and a block of whole chunk rows) to read any part of it: a
# chunk may hold at most this much, or one sample when samples are larger. data_prep writes ~1 MiB.
MAX_CHUNK_BYTES = 64 << 20
# Each chunk costs a B-tree lookup and a read call, ~4 us measured: a million chunks read in ~4 s,
# while a 4-byte chunk per value would take hours and look like a hang.
MAX_CHUNKS = 1 << 20
# Attributes are read whole; the ones of the format are a few bytes (normalization a few kB).
MAX_ATTRIBUTE_BYTES = 1 << 20

REDO = "convert the data with `python -m data_prep`"
FIX = "fix the source data and convert it again with `python -m data_prep`"
SELF_CONTAINED = "the data format admits only self-contained datasets stored in the file; " + REDO


@dataclass(frozen=True)
class Checked:
    """What a checked data file holds, from its attributes and shapes."""

    name: str
    task: str
    num_classes: int
    sample_shape: tuple[int, ...]
    num_train: int
    num_test: int
    source: str
    checksum: str  # the stored one ("" when absent); equal to the content's after a verifying scan


def memory_limit() -> int:
    """Bytes of memory a process here may use: physical memory, or the cgroup's limit (a Slurm
    job's --mem, a container's) when that is lower."""
    try:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf names here: no limit we can know
        limit = 1 << 62
    return min(limit, _cgroup_memory_limit() or limit)


def _cgroup_memory_limit() -> int | None:
    """This process's cgroup memory limit (v2 memory.max, or v1 memory.limit_in_bytes), if any."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":
            candidate = Path("/sys/fs/cgroup") / group.lstrip("/") / "memory.max"
        elif "memory" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/memory") / group.lstrip("/") / "memory.limit_in_bytes"
        else:
            continue
        try:
            text = candidate.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def human(nbytes: int) -> str:
    """A byte count in decimal units: '1.0 kB', '4.2 GB'."""
    size = float(nbytes)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if size < 1000 or unit == "PB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


# -- 1. attributes ----------------------------------------------------------------------------------

def _describe(value: Any) -> str:
    """A value of the wrong type, as a message shows it."""
    if isinstance(value, (str, bytes)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return f"the string {text[:40]!r}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    if isinstance(value, (bool, np.bool_)):
        return f"the boolean {bool(value)}"
    if isinstance(value, (float, np.floating)):
        return f"the float {float(value)}"
    return f"a value of type {type(value).__name__}"


def _attribute(path: Path, f, name: str) -> Any:
    """An attribute's value, read only once its declared size is known to be small."""
    try:
        storage = f.attrs.get_id(name).get_storage_size()
    except (KeyError, OSError) as exc:
        raise DataFormatError(f"{path}: attribute {name} cannot be read ({first_line(exc)}); {REDO}") from None
    if storage > MAX_ATTRIBUTE_BYTES:
        raise DataFormatError(f"{path}: attribute {name} holds {human(storage)}, more than the "
                              f"{human(MAX_ATTRIBUTE_BYTES)} any attribute of the format needs; {REDO}")
    try:
        return f.attrs[name]
    except (OSError, TypeError, ValueError) as exc:
        raise DataFormatError(f"{path}: attribute {name} cannot be read ({first_line(exc)}); {REDO}") from None


def _integer(path: Path, f, name: str) -> int:
    value = _attribute(path, f, name)
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise DataFormatError(f"{path}: {name} must be an integer, got {_describe(value)}; {REDO}")


def _string(path: Path, f, name: str, default: str | None = None) -> str:
    if default is not None and name not in f.attrs:
        return default
    value = _attribute(path, f, name)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    elif isinstance(value, str):
        return value
    raise DataFormatError(f"{path}: {name} must be a string, got {_describe(value)}; {REDO}")


def _sample_shape(path: Path, f) -> tuple[int, ...]:
    value = _attribute(path, f, "sample_shape")
    if (isinstance(value, np.ndarray) and value.ndim == 1 and 1 <= len(value) <= MAX_SAMPLE_DIMS
            and np.issubdtype(value.dtype, np.integer) and (value >= 1).all()):
        return tuple(int(v) for v in value)
    shown = value.tolist() if isinstance(value, np.ndarray) and value.size <= 8 else _describe(value)
    raise DataFormatError(f"{path}: sample_shape must be a list of positive integers, 1 to {MAX_SAMPLE_DIMS} "
                          f"of them (e.g. [1, 28, 28]), got {shown}; {REDO}")


def _attributes(path: Path, f) -> tuple[str, str, int, tuple[int, ...], str, str]:
    """(name, task, num_classes, sample_shape, source, checksum) from the root attributes."""
    if "format_version" not in f.attrs:
        raise DataFormatError(f"{path}: no format_version attribute: not a pgc-mpi data file; {REDO}")
    version = _integer(path, f, "format_version")
    if version != FORMAT_VERSION:
        raise DataFormatError(f"{path}: format_version {version} is not supported (this pgc-mpi reads "
                              f"format_version {FORMAT_VERSION}); convert the data again with this version's "
                              f"`python -m data_prep`")
    missing = [k for k in ("name", "task", "num_classes", "sample_shape") if k not in f.attrs]
    if missing:
        raise DataFormatError(f"{path}: missing attributes {missing}; {REDO}")
    task = _string(path, f, "task")
    if task not in TASKS:
        raise DataFormatError(f"{path}: task {task[:40]!r} is not one of {', '.join(TASKS)}; {REDO}")
    classes = _integer(path, f, "num_classes")
    if task == "regression" and classes != 1:
        raise DataFormatError(f"{path}: num_classes must be 1 for a regression file, got {classes}; {REDO}")
    if not 1 <= classes <= MAX_CLASSES:
        raise DataFormatError(f"{path}: num_classes {classes} is outside 1..{MAX_CLASSES} (a classifier has one "
                              f"output per class); {REDO}")
    return (_string(path, f, "name"), task, classes, _sample_shape(path, f), _string(path, f, "source", ""),
            _string(path, f, "checksum", ""))


# -- 2. structure ---------------------------------------------------------------------------------------------

def _member(path: Path, group, where: str, name: str, split: str) -> Any:
    """`group[name]`, once it is known to be a hard link: soft and external links are refused
    before they are followed (an external link to a FIFO would block forever)."""
    import h5py

    full = f"{where.rstrip('/')}/{name}"
    key = name.encode()
    if not group.id.links.exists(key):
        raise DataFormatError(f"{path}: missing the {split!r} split (/{split}/x and /{split}/y); {REDO}")
    kind = group.id.links.get_info(key).type
    if kind == h5py.h5l.TYPE_SOFT:
        target = printable(group.id.links.get_val(key).decode("utf-8", "replace"))
        raise DataFormatError(f"{path}: {full} is a soft link to {target}: {SELF_CONTAINED}")
    if kind == h5py.h5l.TYPE_EXTERNAL:
        other, target = (printable(v.decode("utf-8", "replace")) for v in group.id.links.get_val(key))
        raise DataFormatError(f"{path}: {full} is an external link to {target} in {other}: {SELF_CONTAINED}")
    if kind != h5py.h5l.TYPE_HARD:
        raise DataFormatError(f"{path}: {full} is a user-defined link: {SELF_CONTAINED}")
    try:
        return group[name]
    except (KeyError, OSError) as exc:
        raise DataFormatError(f"{path}: {full} cannot be opened ({first_line(exc)}); the file is corrupt; "
                              f"{REDO}") from None


def _dataset(path: Path, group, split: str, key: str) -> Any:
    """/split/key as a dataset whose data is stored in this file."""
    import h5py

    full = f"/{split}/{key}"
    dset = _member(path, group, f"/{split}", key, split)
    if not isinstance(dset, h5py.Dataset):
        raise DataFormatError(f"{path}: {full} must be a dataset, got a {type(dset).__name__.lower()}; {REDO}")
    if dset.is_virtual:
        raise DataFormatError(f"{path}: {full} is a virtual dataset (its data comes from other files, and "
                              f"missing ones read as zeros): {SELF_CONTAINED}")
    if dset.external:
        files = ", ".join(printable(str(name)) for name, _, _ in dset.external)
        raise DataFormatError(f"{path}: {full} stores its data outside the file (in {files}): {SELF_CONTAINED}")
    return dset


def _check_types(path: Path, split: str, x, y, task: str, classes: int, shape: tuple[int, ...]) -> None:
    if x.dtype != np.float32 or x.shape[1:] != shape:
        raise DataFormatError(f"{path}: /{split}/x must be float32 of shape [N, {', '.join(map(str, shape))}] "
                              f"(sample_shape), got {x.dtype} {x.shape}; {REDO}")
    if task == "classification" and y.dtype.kind == "f":
        raise DataFormatError(f"{path}: /{split}/y must be int64 class indices 0..{classes - 1} in a "
                              f"classification file, got {y.dtype} labels; {REDO}")
    want = np.int64 if task == "classification" else np.float32
    if y.dtype != want or y.ndim != 1 or len(y) != len(x):
        raise DataFormatError(f"{path}: /{split}/y must be {np.dtype(want)} of shape [{len(x)}], "
                              f"got {y.dtype} {y.shape}; {REDO}")


def _check_storage(path: Path, full: str, dset) -> None:
    """Chunks that one read can decompress without running out of memory or time, and filters
    that this h5py can decode."""
    if not dset.id.get_create_plist().all_filters_avail():
        raise DataFormatError(f"{path}: {full} is compressed with an HDF5 filter this h5py cannot decode; {REDO}")
    if dset.chunks is None:
        return
    row = dset.dtype.itemsize * math.prod(dset.shape[1:])
    chunk = dset.dtype.itemsize * math.prod(dset.chunks)
    at_once = max(chunk, min(dset.chunks[0], max(1, dset.shape[0])) * row)  # the scan reads whole chunk rows
    limit = max(MAX_CHUNK_BYTES, row)
    if at_once > limit:
        raise DataFormatError(f"{path}: {full} has chunks of {dset.chunks} ({human(at_once)} to read at once), more "
                              f"than the {human(limit)} limit; {REDO}")
    count = math.prod(-(-n // c) for n, c in zip(dset.shape, dset.chunks))
    if count > MAX_CHUNKS:
        raise DataFormatError(f"{path}: {full} is stored in {count} chunks, more than {MAX_CHUNKS} (reading them "
                              f"would take too long); {REDO}")


def check_structure(path: Path, f) -> Checked:
    """Stages 1 and 2: the attributes, links, storage, dtypes, shapes and sizes of an open data file,
    without reading its data."""
    name, task, classes, shape, source, stored = _attributes(path, f)
    rows: dict[str, int] = {}
    datasets = []
    for split in SPLITS:
        group = _member(path, f, "/", split, split)
        if not _is_group(group):
            raise DataFormatError(f"{path}: /{split} must be a group holding x and y; {REDO}")
        x, y = _dataset(path, group, split, "x"), _dataset(path, group, split, "y")
        _check_types(path, split, x, y, task, classes, shape)
        rows[split] = len(x)
        datasets += [(f"/{split}/x", x), (f"/{split}/y", y)]
    # The master reads both splits whole (evaluation): the declared data must fit in memory. Checked
    # before anything is allocated, so 10**12 rows in a tiny file of fill values are refused here.
    total = sum(d.dtype.itemsize * math.prod(d.shape) for _, d in datasets)
    limit = memory_limit()
    if total > limit:
        dims = list(shape)
        raise DataFormatError(f"{path}: the data (train {rows['train']} x {dims}, test {rows['test']} x {dims}: "
                              f"{human(total)}) is more than this machine's memory ({human(limit)}), the limit: "
                              f"the master holds both splits to evaluate; the file is corrupt, or use a machine with "
                              f"more memory")
    for full, dset in datasets:
        _check_storage(path, full, dset)
    return Checked(name, task, classes, shape, rows["train"], rows["test"], source, stored)


def _is_group(obj: Any) -> bool:
    import h5py

    return isinstance(obj, h5py.Group)


# -- 3. content ---------------------------------------------------------------------------------------------

def first_non_finite(a: np.ndarray) -> tuple[int, ...] | None:
    """The index of the first NaN or infinity of `a` in C order, or None; a pass that allocates
    nothing when there is none (min and max propagate NaN)."""
    if a.size == 0 or (np.isfinite(a.min()) and np.isfinite(a.max())):
        return None
    flat = np.flatnonzero(~np.isfinite(a.reshape(-1)))[0]
    return tuple(int(i) for i in np.unravel_index(flat, a.shape))


def _blocks(path: Path, full: str, dset) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, rows) blocks of about SCAN_BYTES of whole chunk rows, read into one buffer."""
    n = len(dset)
    if n == 0:
        return
    row = max(1, dset.dtype.itemsize * math.prod(dset.shape[1:]))
    step = max(1, SCAN_BYTES // row)
    if dset.chunks is not None:  # whole chunk rows: each chunk is decompressed once
        step = max(dset.chunks[0], step // dset.chunks[0] * dset.chunks[0])
    step = min(step, n)
    buffer = np.empty((step, *dset.shape[1:]), dtype=dset.dtype)
    for start in range(0, n, step):
        stop = min(n, start + step)
        try:
            dset.read_direct(buffer, np.s_[start:stop], np.s_[0:stop - start])
        except (OSError, ValueError) as exc:
            raise DataFormatError(f"{path}: cannot read {full} rows {start}..{stop - 1} ({first_line(exc)}); "
                                  f"the file is corrupt; {REDO}") from None
        yield start, buffer[:stop - start]


def _feature_check(path: Path, split: str, key: str, what: str) -> Callable[[int, np.ndarray], None]:
    def check(start: int, block: np.ndarray) -> None:
        bad = first_non_finite(block)
        if bad is not None:
            index = ", ".join(map(str, (start + bad[0], *bad[1:])))
            raise DataFormatError(f"{path}: /{split}/{key}[{index}] is {block[bad]}: the {split} split's {what} "
                                  f"must be finite (this is the first bad one); {FIX}")
    return check


def _label_check(path: Path, split: str, classes: int) -> Callable[[int, np.ndarray], None]:
    def check(start: int, block: np.ndarray) -> None:
        if block.min() >= 0 and block.max() < classes:
            return
        at = int(np.flatnonzero((block < 0) | (block >= classes))[0])
        value = int(block[at])
        # torch's cross_entropy skips label -100 without a word: training would report loss 0.0
        hint = " (-100 is torch's ignore_index: cross-entropy would skip the sample silently)" if value == -100 else ""
        raise DataFormatError(f"{path}: /{split}/y[{start + at}] = {value} is not a class index 0..{classes - 1} "
                              f"(num_classes {classes}){hint}: the {split} split's labels must be class indices "
                              f"(this is the first bad one); {FIX}")
    return check


def scan(path: Path, f, checked: Checked, *, verify_checksum: bool = True) -> None:
    """Stage 3, on a file check_structure passed: one streaming pass over /train/x, /train/y,
    /test/x, /test/y in that order (the checksum's), checking labels and finite values and, with
    verify_checksum, the stored sha256."""
    digest = None
    if verify_checksum:
        if not checked.checksum:
            raise DataFormatError(f"{path}: no checksum attribute, so the content cannot be verified; {REDO}, "
                                  f"or open it without checksum verification")
        if not re.fullmatch(r"[0-9a-f]{64}", checked.checksum):
            raise DataFormatError(f"{path}: checksum {checked.checksum[:40]!r} is not a sha256 hex digest; {REDO}")
        digest = hashlib.sha256()
    for split in SPLITS:
        checks = {"x": _feature_check(path, split, "x", "features"),
                  "y": (_label_check(path, split, checked.num_classes) if checked.task == "classification"
                        else _feature_check(path, split, "y", "regression targets"))}
        for key, check in checks.items():
            for start, block in _blocks(path, f"/{split}/{key}", f[split][key]):
                if digest is not None:
                    digest.update(block)  # C-contiguous rows: the bytes h5format.checksum hashes
                check(start, block)
    if digest is not None and digest.hexdigest() != checked.checksum:
        content = digest.hexdigest()
        raise DataFormatError(f"{path}: checksum mismatch (stored {checked.checksum[:12]}..., content "
                              f"{content[:12]}...): the file is corrupt or was modified after it was written "
                              f"(`python -m data_prep verify FILE` checks a file or a copy of it); convert the data "
                              f"again with `python -m data_prep`")


def printable(text: str) -> str:
    """`text` with control characters escaped: a name taken from a file (a link target, an
    external file) cannot break the one-line message."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def first_line(exc: BaseException) -> str:
    """An exception's message, first line only (h5py's carry HDF5's multi-line details)."""
    lines = str(exc).strip().splitlines()
    return lines[0].rstrip(",") if lines else type(exc).__name__
