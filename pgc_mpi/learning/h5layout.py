"""The names of pgc-mpi's HDF5 data layout that its writer (h5format) and its checks (h5check)
share: the format version, the splits, the tasks and the error of a file not in the layout (the
layout itself is described in h5format)."""

from __future__ import annotations

from ..errors import PgcError

FORMAT_VERSION = 1
SPLITS = ("train", "test")
TASKS = ("classification", "regression")


class DataFormatError(PgcError):
    """A data file that is missing, unreadable or not in pgc-mpi's HDF5 layout."""
