"""The parameter vector's shards among the servers (--servers K): K contiguous slices, as equal as
can be. Every server updates its own shard, and every worker sends each server its part of a
message (pgc_mpi.runtime.servers, pgc_mpi.runtime.transport)."""

from __future__ import annotations

from ..errors import ConfigError


def shard_bounds(dim: int, servers: int) -> list[slice]:
    """The K contiguous shards of a `dim`-vector, as equal as can be (the first ones one longer)."""
    if servers > dim:
        raise ConfigError(f"--servers {servers} is more than the model's {dim} parameters: every server holds at "
                          f"least one; use --servers {dim} or fewer")
    base, extra = divmod(dim, servers)
    bounds, lo = [], 0
    for k in range(servers):
        hi = lo + base + (k < extra)
        bounds.append(slice(lo, hi))
        lo = hi
    return bounds
