"""pgc-mpi: pipelined gradient coding and its baselines on an MPI parameter server."""

from .errors import ConfigError, NotDecodable, PgcError, SchemeError
from .schemes import SCHEME_NAMES, make_scheme

__version__ = "0.1.0"

__all__ = [
    "SCHEME_NAMES",
    "ConfigError",
    "NotDecodable",
    "PgcError",
    "SchemeError",
    "make_scheme",
    "__version__",
]
