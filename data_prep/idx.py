"""Reading MNIST-format IDX files (gzipped or not), with checks that name the file and the problem."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from .errors import InputError

_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """The array stored in an IDX file (magic 0x0000TTDD: type TT, DD dimensions)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot decompress ({exc}); the download is truncated or corrupt") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
        raise InputError(f"{path}: not an IDX file (bad magic number)")
    ndim = raw[3]
    if ndim == 0 or len(raw) < 4 + 4 * ndim:
        raise InputError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    dtype = np.dtype(_TYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    body = raw[4 + 4 * ndim:]
    if len(body) != expected:
        raise InputError(f"{path}: IDX data has {len(body)} bytes, the header promises {expected} "
                         f"(shape {list(dims)}): the file is truncated or corrupt")
    return np.frombuffer(body, dtype=dtype).reshape(dims)


def read_idx_pair(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images [N, 1, H, W] (raw values) and int64 labels [N] from an IDX image/label pair."""
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3:
        raise InputError(f"{images}: expected images of shape [N, H, W], got {list(x.shape)}")
    if y.ndim != 1:
        raise InputError(f"{labels}: expected labels of shape [N], got {list(y.shape)}")
    if len(x) != len(y):
        raise InputError(f"{images} has {len(x)} images but {labels} has {len(y)} labels")
    return x[:, None, :, :], y.astype(np.int64)
