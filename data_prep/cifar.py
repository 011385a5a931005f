"""Reading the official CIFAR-10 python archive (cifar-10-python.tar.gz) without trusting its pickles."""

from __future__ import annotations

import gzip
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


# A batch pickle is 31,035,704 bytes (test_batch 31,035,526): 10000 x 3072 pixel bytes, 10000
# labels, 10000 file names and a batch label. No member may exceed MEMBER_LIMIT (8% above that),
# nor the decompressed archive TOTAL_LIMIT (the official one is ~186 MB): a small gzip bomb (14
# MB of gzip reached 3.0 GiB) is refused after reading at most that much, whatever its headers say.
MEMBER_LIMIT = 32 << 20
TOTAL_LIMIT = 8 * MEMBER_LIMIT
# The official archive has 9 members (the directory, 6 batches, batches.meta, readme.html).
MAX_MEMBERS = 64
OFFICIAL = "is this the official cifar-10-python.tar.gz?"


class _Bounded(io.RawIOBase):
    """The decompressed archive, read through a counter: past TOTAL_LIMIT bytes it refuses. This
    also bounds what tarfile reads by itself (a pax or GNU long-name header is read whole)."""

    def __init__(self, raw, path: Path):
        self._raw, self._path, self.count = raw, path, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        limit = TOTAL_LIMIT + 1 - self.count  # reading limit+1 tells "more than the limit"
        data = self._raw.read(limit if size is None or size < 0 else min(size, limit))
        self.count += len(data)
        if self.count > TOTAL_LIMIT:
            raise InputError(f"{self._path}: the archive decompresses to more than {TOTAL_LIMIT} bytes, far more "
                             f"than the official cifar-10-python.tar.gz (~186 MB); {OFFICIAL}")
        return data


def _declared_size(member: tarfile.TarInfo) -> int:
    """The size a member's tar header declares."""
    return member.size


def _read_member(archive: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> bytes:
    """A member's bytes: its declared size checked before reading, and never more than
    MEMBER_LIMIT bytes read even if the header lies."""
    if not member.isfile():
        raise InputError(f"{path}: {member.name} is not a regular file in the archive (a link or a directory); "
                         f"{OFFICIAL}")
    declared = _declared_size(member)
    if declared > MEMBER_LIMIT:
        raise InputError(f"{path}: {member.name} declares {declared} bytes, more than a CIFAR-10 batch can hold "
                         f"(limit {MEMBER_LIMIT}); {OFFICIAL}")
    fh = archive.extractfile(member)
    raw = fh.read(min(declared, MEMBER_LIMIT) + 1)
    if len(raw) > declared or len(raw) > MEMBER_LIMIT:
        raise InputError(f"{path}: {member.name} holds more than {min(declared, MEMBER_LIMIT)} bytes, more than "
                         f"its header declares or the limit allows; {OFFICIAL}")
    return raw


def _batch(raw: bytes, member: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        batch = _SafeUnpickler(io.BytesIO(raw), encoding="bytes").load()
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


def _batches(archive: tarfile.TarFile, path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The six batches, in one pass over the archive in stream mode: each is unpickled as it
    arrives (only one member's bytes are held at a time), and reading stops once all are in."""
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for count, member in enumerate(archive, start=1):
        if count > MAX_MEMBERS:
            raise InputError(f"{path}: more than {MAX_MEMBERS} members in the archive; {OFFICIAL}")
        if member.name in found:
            raise InputError(f"{path}: {member.name} appears twice in the archive; {OFFICIAL}")
        if member.name not in MEMBERS:
            if _declared_size(member) > MEMBER_LIMIT:  # skipping it would still decompress it
                raise InputError(f"{path}: {member.name!r} declares {_declared_size(member)} bytes, more than any "
                                 f"member of the official archive (limit {MEMBER_LIMIT}); {OFFICIAL}")
            continue
        found[member.name] = _batch(_read_member(archive, member, path), member.name, path)
        if len(found) == len(MEMBERS):
            break
    return found


def read_cifar10(path: Path) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((x_train, y_train), (x_test, y_test)) as uint8 [N, 3, 32, 32] images and int64 labels."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file (download cifar-10-python.tar.gz from the CIFAR-10 page yourself)")
    try:
        with gzip.open(path, "rb") as gz, tarfile.open(fileobj=_Bounded(gz, path), mode="r|") as archive:
            found = _batches(archive, path)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot read the archive ({exc}); it is truncated or corrupt") from None
    missing = [m for m in MEMBERS if m not in found]
    if missing:
        raise InputError(f"{path}: missing {missing[0]}; {OFFICIAL}")
    batches = [found[m] for m in MEMBERS]
    x_train = np.concatenate([b[0] for b in batches[:-1]])
    y_train = np.concatenate([b[1] for b in batches[:-1]])
    return (x_train, y_train), batches[-1]
