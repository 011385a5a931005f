"""Shared fixtures, and one truthful summary for multi-rank (pytest-mpi) runs.

Under `mpiexec -n N python -m pytest --with-mpi` every rank runs every test. Ranks > 0 write
their terminal report to a log file instead of the screen, and a failure of an mpi-marked test
on any rank fails it on every rank, so rank 0's summary line is the truth.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _with_mpi(config: pytest.Config) -> bool:
    return bool(config.getoption("--with-mpi", default=False))


def pytest_sessionstart(session: pytest.Session) -> None:
    """A segment a killed MPI job left in /dev/shm hangs a later job in MPI_Init (pgc_mpi.job.shm)."""
    from pgc_mpi.job import shm

    if not _with_mpi(session.config):
        shm.report_stale(shm.remove_stale())


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The MPI library and mpi4py in use; under --with-mpi, this rank and the world size.

    This imports (so initializes) MPI, which a serial run does anyway: collecting test_transport_mpi.py
    imports pgc_mpi.runtime.transport. Importing it with mpi4py.rc.initialize = False instead would leave MPI
    uninitialized for good
    in this process, and in-process code that calls MPI later would abort. Measured: the import costs ~0.08 s, the
    initialization ~0.05 s more. A serial run is a singleton with no peers, so its start-up segment is unlinked at
    once (pytest_configure does it under --with-mpi): a killed pytest leaves nothing in /dev/shm.
    """
    import mpi4py
    from mpi4py import MPI

    if not _with_mpi(config):
        from pgc_mpi.job import shm

        shm.unlink_own_segments()
    library = " ".join(MPI.Get_library_version().splitlines()[0].split())  # "MPICH Version:      5.0.2"
    lines = [f"MPI library: {library}, mpi4py {mpi4py.__version__}"]
    if _with_mpi(config):
        lines.append(f"MPI rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}")
    return lines


@pytest.hookimpl(trylast=True)  # after the terminal reporter exists
def pytest_configure(config: pytest.Config) -> None:
    if not _with_mpi(config):
        return
    from mpi4py import MPI

    from pgc_mpi.job import shm

    MPI.COMM_WORLD.Barrier()  # every rank is past MPI_Init: this run leaves no segment behind
    shm.unlink_own_segments()
    rank = MPI.COMM_WORLD.Get_rank()
    if rank > 0:
        log_dir = Path(os.environ.get("PGC_TEST_LOG_DIR", "/tmp"))
        log = open(log_dir / f"pgc-pytest-rank{rank}.log", "w")  # noqa: SIM115 (lives as long as the run)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter._tw = type(reporter._tw)(log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" or not _with_mpi(item.config) or item.get_closest_marker("mpi") is None:
        return
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    failed = comm.allgather(rep.failed)
    if any(failed) and not rep.failed:
        bad = [r for r, f in enumerate(failed) if f]
        rep.outcome = "failed"
        rep.longrepr = f"failed on rank(s) {bad}; see their logs (PGC_TEST_LOG_DIR, default /tmp)"
