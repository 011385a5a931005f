"""The `pgc-train` console entry, kept light: stop signals are handled before torch is imported,
so a signal that arrives while the ranks are still starting does not kill one of them."""

from __future__ import annotations

import sys

# mpi4py is a dependency, an MPI library is not: the [mpich] extra's, or the site's.
MPI_MISSING = ("pgc-train needs an MPI library and mpi4py cannot load one: pip install 'pgc-mpi[mpich]' "
               "(MPICH from a wheel), or build mpi4py against your site MPI (docs/install.md)")


def mpi_loads() -> bool:
    """Whether mpi4py can load an MPI library. Its binary wheel looks for one (the [mpich] extra's,
    or the system's) when mpi4py.MPI is first found; asking so does not initialize MPI."""
    import importlib.util

    try:
        importlib.util.find_spec("mpi4py.MPI")
    except RuntimeError:  # "cannot load MPI library", then every path it tried
        return False
    return True


def prepare_process(prog: str = "pgc-train") -> None:
    """What a training process does before MPI starts (pgc-train, and pgc_mpi.fit in a user's
    script): fault tracebacks on, stop signals recorded, an MPI library that loads (else one
    line and exit status 2), and stale MPICH segments of killed jobs removed while MPI is not
    yet initialized (a user's script may have imported mpi4py.MPI already: then not)."""
    import faulthandler

    from ..runtime import signals
    from . import shm

    faulthandler.enable()  # a crash in native code (torch, MPI) still says where it happened
    signals.install()
    if not mpi_loads():
        print(MPI_MISSING.replace("pgc-train", prog), file=sys.stderr)
        sys.exit(2)
    # before MPI_Init: a segment a killed MPI job left on this node would hang it (see pgc_mpi.job.shm)
    if "mpi4py.MPI" not in sys.modules:
        shm.report_stale(shm.remove_stale())


def train() -> None:
    """Run pgc-train (does not return: it finalizes MPI and exits)."""
    prepare_process()
    from .train import cli

    cli()
