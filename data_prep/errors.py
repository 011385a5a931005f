"""The error data_prep raises for bad input: one line naming the file and the problem."""

from __future__ import annotations

from pgc_mpi.errors import PgcError


class InputError(PgcError):
    """An input file that is missing, truncated, corrupt or inconsistent."""
