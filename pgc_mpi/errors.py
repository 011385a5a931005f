"""Exceptions shared by every layer; each message says what to change."""

from __future__ import annotations


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
