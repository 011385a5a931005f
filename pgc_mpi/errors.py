"""Exceptions shared by every layer; each message says what to change."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path


class PgcError(Exception):
    """Base class of pgc-mpi's own errors: a one-line message meant for the user."""


class SchemeError(PgcError, ValueError):
    """Invalid scheme parameters (n, s, c, name)."""


class NotDecodable(PgcError):
    """The arrived messages are not enough to decode the step."""


class ConfigError(PgcError, ValueError):
    """An invalid run configuration: a flag, a TOML key or a combination of them."""


class Diverged(PgcError):
    """Training produced non-finite numbers: every worker's gradient, or the parameters themselves."""


class RunDataError(PgcError):
    """A run's recorded file (config.json, say) that is missing or damaged beyond reading."""


class WriteError(PgcError):
    """A file that could not be written: a full disk, a missing permission, a read-only file system."""


def write_failure(path: Path, exc: OSError) -> str:
    """One line for a failed write: the path, and the cause in words ("no space left on device")."""
    code = exc.errno
    if code is None:  # h5py sometimes leaves errno unset and puts HDF5's in the text
        found = re.search(r"errno = (\d+)", str(exc))
        code = int(found.group(1)) if found else None
    if code in (errno.ENOSPC, errno.EDQUOT):
        reason = "no space left on device" if code == errno.ENOSPC else "disk quota exceeded"
        return f"{path}: cannot write: {reason}; free some space or write it elsewhere"
    lines = str(exc).strip().splitlines()
    reason = os.strerror(code) if code else (lines[0] if lines else type(exc).__name__)
    return f"{path}: cannot write: {reason}"
