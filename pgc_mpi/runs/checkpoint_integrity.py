"""Whether a checkpoint file can be trusted: the SHA-256 digest in its HDF5 user block, written
with it (`digest_block`) and verified on the file's plain bytes (`verify`) before HDF5 parses any
of them, and the errors that refuse a checkpoint.

Every checkpoint begins with a 512-byte HDF5 user block (which HDF5 reserves for its users and
skips) holding, as text, the SHA-256 and the length of the HDF5 file after it: every dataset
(parameters, optimizer state, buffers...), every attribute and the HDF5 structure itself. Reading
a checkpoint (pgc_mpi.runs.checkpoint_reading) verifies it first, so a flipped bit anywhere, a file
cut short or changed after it was written is refused before a number is used, and before HDF5
parses it: HDF5 can crash (SIGSEGV) on some damaged files. The cost: one more read of the file
(SHA-256 runs at ~2 GB/s). A file without the block (it begins with HDF5's own signature), written
before digests were stored, is still accepted: it gets the reader's structural checks only. A
file beginning with neither is damaged. A file edited on purpose (h5py "r+") fails the digest
until `seal` writes a new one.

Every failure is one line: CheckpointError; for damage (unreadable, incomplete, a wrong digest,
contents that do not fit together, whatever h5py raises reading it) its subclass
DamagedCheckpointError, which `load_resume` falls back past.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ..errors import PgcError
from ..learning.h5format import USERBLOCK

# The digest lives in the file's HDF5 user block, the first USERBLOCK bytes, which HDF5 reserves for
# its users and skips: it can be checked on the file's plain bytes before HDF5 parses any of them.
_MAGIC = b"pgc-mpi checkpoint v1\n"
_BLOCK = re.compile(rb"pgc-mpi checkpoint v1\nsha256 ([0-9a-f]{64})\nbytes ([0-9]{1,20})\n\0*")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # where a file without a user block (an older checkpoint) begins
_HASH_BLOCK = 16 << 20  # bytes hashed at a time: memory stays bounded for any checkpoint


class CheckpointError(PgcError):
    """A checkpoint that is missing, corrupt, or from another run shape."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint whose contents cannot be trusted: unreadable, incomplete, its digest wrong, or
    its arrays inconsistent with one another. `load_resume` falls back past such a file to an
    earlier one; a checkpoint of another run is a plain CheckpointError and never falls back."""


def digest_block(image: bytes | memoryview) -> bytes:
    """The user block written before a checkpoint's HDF5 image: the SHA-256 and the length of the
    image, as text, zero-padded to USERBLOCK bytes (HDF5 skips it, `head -c 512` shows it)."""
    text = _MAGIC + f"sha256 {hashlib.sha256(image).hexdigest()}\nbytes {len(image)}\n".encode()
    return text.ljust(USERBLOCK, b"\0")


def verify(path: Path) -> bool:
    """Check a checkpoint's bytes against the digest in its user block, reading the file as plain
    bytes (HDF5 never sees a damaged file). True when verified; False for a file written before
    digests were stored (it begins with HDF5's signature itself), which is accepted as it is.
    DamagedCheckpointError for a file cut short, changed, or beginning with neither."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            head = fh.read(USERBLOCK)
            if head.startswith(_HDF5_SIGNATURE):
                return False  # written before digests: the structural checks of `load` only
            if not head.startswith(_MAGIC):
                raise DamagedCheckpointError(f"{path}: not a readable checkpoint (it begins with neither a pgc-mpi "
                                             f"checkpoint's digest block nor HDF5's signature); the file is damaged "
                                             f"or not a checkpoint; use an earlier one")
            if len(head) < USERBLOCK:
                raise DamagedCheckpointError(f"{path}: damaged or incomplete checkpoint (cut short: {len(head)} "
                                             f"bytes); use an earlier one")
            match = _BLOCK.fullmatch(head)
            if match is None:
                raise DamagedCheckpointError(f"{path}: the checkpoint is damaged (its digest block is garbled); use "
                                             f"an earlier one")
            want, length = match.group(1).decode(), int(match.group(2))
            h, read = hashlib.sha256(), 0
            while chunk := fh.read(_HASH_BLOCK):
                h.update(chunk)
                read += len(chunk)
    except OSError as exc:
        raise DamagedCheckpointError(f"{path}: not a readable checkpoint ({first_line(exc)}); use an earlier "
                                     f"one") from None
    if read != length:
        raise DamagedCheckpointError(f"{path}: damaged or incomplete checkpoint ({read} bytes after its digest block, "
                                     f"{length} written: cut short or appended to); use an earlier one")
    if h.hexdigest() != want:
        raise DamagedCheckpointError(f"{path}: damaged or incomplete checkpoint (its bytes do not match the digest "
                                     f"written with it: a flipped bit, a bad copy, or a change after it was "
                                     f"written); use an earlier checkpoint")
    return True


def seal(path: Path) -> Path:
    """Write a fresh digest block for checkpoint `path` as it now is: for a file changed on purpose
    (tests of the structural checks edit one with h5py), never for one that failed `verify` by
    accident. Not atomic: the file is rewritten in place."""
    path = Path(path)
    data = path.read_bytes()
    image = memoryview(data)[USERBLOCK:] if data.startswith(_MAGIC) else memoryview(data)
    with path.open("wb") as fh:
        fh.write(digest_block(image))
        fh.write(image)
    return path


def first_line(exc: BaseException) -> str:
    """An exception's message on one line (h5py's can span several): what a one-line
    CheckpointError quotes of the error beneath it."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
