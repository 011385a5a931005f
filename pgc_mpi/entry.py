"""The `pgc-train` console entry, kept light: stop signals are handled before torch is imported,
so a signal that arrives while the ranks are still starting does not kill one of them."""

from __future__ import annotations


def train() -> None:
    """Run pgc-train (does not return: it finalizes MPI and exits)."""
    import faulthandler

    from . import shm, signals

    faulthandler.enable()  # a crash in native code (torch, MPI) still says where it happened
    signals.install()
    # before MPI_Init: a segment a killed MPI job left on this node would hang it (see pgc_mpi.shm)
    shm.report_stale(shm.remove_stale())
    from .train import cli

    cli()
