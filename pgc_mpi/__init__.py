"""pgc-mpi: pipelined gradient coding and its baselines on an MPI parameter server.

The public API is what `__all__` lists (docs/api.md shows it in use). Names are
imported on first use, so `import pgc_mpi` (and `pgc-train --help`, and every configuration
error) costs no torch import.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .core.schemes import SCHEME_NAMES, make_scheme
from .errors import ConfigError, NotDecodable, PgcError, SchemeError

__version__ = "0.1.0"

# name -> module that defines it (imported when the name is first used)
_LAZY = {
    "TrainConfig": "config",
    "fit": "job.fitting",
    "options_from_args": "config",
    "FitResult": "job.fitting",
    "SimConfig": "config",
    "simulate": "sim.simulator",
    "replay": "sim.replaying",
    "SimResult": "sim.simulator",
    "LeastSquares": "learning.problems",
    "Logistic": "learning.problems",
    "Quadratic": "learning.problems",
    "FlatParams": "learning.torch_problem",
    "build_model": "learning.architectures",
    "TorchProblem": "learning.torch_problem",
    "torch_problem": "learning.torch_problem",
    "open_dataset": "learning.datasets",
    "DelayModel": "core.stragglers",
    "write_trace": "core.stragglers",
    "realized_delays": "runs.results",
    "summarize_run": "runs.results",
    "read_metrics": "runs.metrics",
    "read_steps": "runs.results",
    "Message": "core.message",
    "MessageRecord": "core.message",
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
