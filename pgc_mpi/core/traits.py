"""Every scheme pgc-mpi runs, one row each, with the traits its drivers ask about.

This table is the one place that says which scheme waits for every worker, depends on s,
abandons a decided step, drops compute, runs without a master and so on: the drivers (the MPI
master and workers, the simulator, the configuration's checks, pgc-bench, pgc-advise) ask
`traits(name)` instead of testing names. Adding a scheme or a trait is one row or one column.
How a scheme decodes (placement, decoder, exactness) is pgc_mpi.core.schemes's `_Rule`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Traits:
    """What a scheme is, as its drivers need to know it."""

    name: str
    simulated: bool = True  # pgc-sim runs it (ddp has no simulated twin of its own: dgd is one)
    peer: bool = False  # no parameter server: torch.distributed all-reduce between the workers (ddp)
    waits_for_all: bool = False  # a step takes every worker's message (dgd, ddp): s means nothing
    depends_on_s: bool = True  # a run depends on s (dgd waits for all; pbs has its own replication and window)
    pipelined: bool = False  # one fresh partition gradient per step, the others from stored buffers
    table: bool = False  # the master keeps a partition table, not decode weights (pbs)
    sets_c: bool = False  # c (partitions per worker, or pbs's window) may be chosen (--c); else s + 1 or 1
    abandons: bool = True  # --abandon-late applies: a decided step can be moot for a slow worker
    drops_compute: bool = False  # --drop-compute applies: a worker sends the micro-batches done by a threshold
    stale_buffers: bool = False  # its coded messages combine stale buffers: --staleness-correction applies


_ROWS = (
    # dgd decides a step only with every worker's message, so none is moot (no abandoning); a
    # worker past DropCompute's threshold sends what it has, and the master averages over it.
    Traits("dgd", waits_for_all=True, depends_on_s=False, abandons=False, drops_compute=True),
    Traits("is-sgd"),
    Traits("gc-fr"),
    Traits("gc-cr"),
    Traits("is-gc-fr", sets_c=True),
    Traits("is-gc-cr", sets_c=True),
    Traits("pgc-fr", pipelined=True, stale_buffers=True),
    Traits("pgc-cr", pipelined=True, stale_buffers=True),
    # pbs's table takes a late gradient if it is newer than its entry: never moot, never abandoned
    Traits("pbs", depends_on_s=False, pipelined=True, table=True, sets_c=True, abandons=False),
    # ddp: dgd's trajectory and waiting rule, over an all-reduce (pgc-train only)
    Traits("ddp", simulated=False, peer=True, waits_for_all=True, depends_on_s=False, abandons=False,
           drops_compute=True),
)
TRAITS = {row.name: row for row in _ROWS}

# The views the drivers list (each derived from the table, never written out again):
SCHEME_NAMES = tuple(t.name for t in _ROWS if t.simulated)  # the schemes the simulator runs (and pgc-train)
PEER_SCHEMES = tuple(t.name for t in _ROWS if t.peer)  # the schemes only pgc-train runs, without a master
S_FREE = tuple(t.name for t in _ROWS if not t.depends_on_s)  # one run per seed and delay model, whatever s


def schemes_with(trait: str) -> tuple[str, ...]:
    """The names of the schemes that have `trait` (a Traits field), in the table's order."""
    return tuple(t.name for t in _ROWS if getattr(t, trait))


def traits(name: str) -> Traits:
    """The traits of scheme `name` (KeyError for a name no row has: the caller checked it)."""
    return TRAITS[name]
