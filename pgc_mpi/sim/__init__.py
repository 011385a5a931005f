"""The simulator layer: the event-driven simulator (`simulator`), a recorded run replayed
(`replaying`), `pgc-sim` (`cli`, `report`), pgc-bench's simulated backend (`backend`), the
master's cost model (`master_cost`) and the pbs study (`pbs_study`). `from pgc_mpi.sim import
simulate, replay, SimResult` keeps working (the names load on first use: the simulator imports
torch, `pgc-sim --help` must not)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {"simulate": ".simulator", "SimResult": ".simulator", "replay": ".replaying"}  # name -> its module


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'pgc_mpi.sim' has no attribute {name!r}")
