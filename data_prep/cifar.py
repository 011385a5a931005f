"""Reading the official CIFAR-10 python archive (cifar-10-python.tar.gz) without trusting its pickles."""

from __future__ import annotations

import io
import pickle
import tarfile
import zlib
from pathlib import Path

import numpy as np

from .errors import InputError

MEMBERS = [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)] + ["cifar-10-batches-py/test_batch"]

# The batches are pickled dicts of bytes keys, lists and NumPy arrays: nothing else may load.
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _batch(archive: tarfile.TarFile, member: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        fh = archive.extractfile(member)
    except KeyError:
        raise InputError(f"{path}: missing {member}; is this the official cifar-10-python.tar.gz?") from None
    try:
        batch = _SafeUnpickler(io.BytesIO(fh.read()), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise InputError(f"{path}: {member} is not a CIFAR-10 batch ({exc})") from None
    try:
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (KeyError, TypeError):
        raise InputError(f"{path}: {member} lacks b'data' or b'labels'") from None
    if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
        raise InputError(f"{path}: {member} has data {list(data.shape)} and {len(labels)} labels; "
                         f"expected [N, 3072] and N labels")
    return data.reshape(-1, 3, 32, 32), labels


def read_cifar10(path: Path) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((x_train, y_train), (x_test, y_test)) as uint8 [N, 3, 32, 32] images and int64 labels."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file (download cifar-10-python.tar.gz from the CIFAR-10 page yourself)")
    try:
        with tarfile.open(path, "r:gz") as archive:
            batches = [_batch(archive, m, path) for m in MEMBERS]
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot read the archive ({exc}); it is truncated or corrupt") from None
    x_train = np.concatenate([b[0] for b in batches[:-1]])
    y_train = np.concatenate([b[1] for b in batches[:-1]])
    return (x_train, y_train), batches[-1]
