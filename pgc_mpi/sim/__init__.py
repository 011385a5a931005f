"""The simulator layer: the event-driven simulator (`simulator`), `pgc-sim` (`cli`, `report`),
pgc-bench's simulated backend (`backend`), the master's cost model (`master_cost`) and the pbs
study (`pbs_study`). `from pgc_mpi.sim import simulate, replay, SimResult` keeps working (the
names load on first use: the simulator imports torch, `pgc-sim --help` must not)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_FROM_SIMULATOR = ("simulate", "replay", "SimResult")


def __getattr__(name: str) -> Any:
    if name in _FROM_SIMULATOR:
        return getattr(import_module(".simulator", __name__), name)
    raise AttributeError(f"module 'pgc_mpi.sim' has no attribute {name!r}")
