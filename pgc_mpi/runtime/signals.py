"""Requests by signal: stop (Slurm's `--signal`, SIGUSR1 by default here, SIGTERM, and SIGINT:
Ctrl-C or `scancel --signal=INT`) and checkpoint now (SIGUSR2).

Every rank installs the handler, so a signal that reaches the whole job (srun and mpiexec
forward it to all ranks) does not kill anyone on the spot: the master notices the request
between two polls, finishes or abandons the current step, writes its metrics, stops the
workers and exits with EXIT_STOPPED so the batch script can requeue the job.
"""

from __future__ import annotations

import signal

EXIT_STOPPED = 3  # the run stopped early on request: requeue or resume it
_requested: list[int] = []
_checkpoints: list[int] = []


def install() -> None:
    """Record SIGUSR1, SIGTERM and SIGINT (stop) and SIGUSR2 (checkpoint) instead of dying from them
    (Ctrl-C then stops a run like SIGTERM does: no traceback, a checkpoint, exit status 3)."""
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: _requested.append(signum))
    signal.signal(signal.SIGUSR2, lambda signum, frame: _checkpoints.append(signum))


def checkpoint_requested() -> bool:
    """Whether SIGUSR2 arrived since the last call (each request is answered once)."""
    if not _checkpoints:
        return False
    _checkpoints.clear()
    return True


def requested() -> str | None:
    """The name of the first stop signal received, or None."""
    return signal.Signals(_requested[0]).name if _requested else None
