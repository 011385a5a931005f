"""pgc-mpi: pipelined gradient coding and its baselines on an MPI parameter server.

The public API is what `__all__` lists (the README's "Python API" shows it in use). Names are
imported on first use, so `import pgc_mpi` (and `pgc-train --help`, and every configuration
error) costs no torch import.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .errors import ConfigError, NotDecodable, PgcError, SchemeError
from .schemes import SCHEME_NAMES, make_scheme

__version__ = "0.1.0"

# name -> module that defines it (imported when the name is first used)
_LAZY = {
    "TrainConfig": "config",
    "fit": "fitting",
    "options_from_args": "config",
    "FitResult": "fitting",
    "SimConfig": "config",
    "simulate": "sim",
    "replay": "sim",
    "SimResult": "sim",
    "LeastSquares": "problems",
    "Logistic": "problems",
    "Quadratic": "problems",
    "FlatParams": "models",
    "TorchProblem": "models",
    "torch_problem": "models",
    "open_dataset": "datasets",
    "DelayModel": "stragglers",
    "write_trace": "stragglers",
    "realized_delays": "results",
    "summarize_run": "results",
    "read_metrics": "metrics",
    "read_steps": "message_log",
    "Message": "message",
    "MessageRecord": "message",
}

__all__ = [
    "SCHEME_NAMES",
    "ConfigError",
    "NotDecodable",
    "PgcError",
    "SchemeError",
    "make_scheme",
    "__version__",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'pgc_mpi' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
