"""--drop-compute auto over MPI: rank 0 tells every worker the threshold it chose.

Rank 0 (dgd's master, or ddp's monitor) chooses the threshold from its step records
(pgc_mpi.core.drop_compute.AutoThreshold) and sends it to every worker once: one float64 with
tag TAG_THRESHOLD. A worker looks for it with Iprobe when a job begins and applies it from the
first job that begins after it arrived (the jobs in between are computed whole, as in the
measured steps). inf says that keeping every micro-batch was best.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from mpi4py import MPI

from ..core.drop_compute import AUTO

# 101..104: pgc_mpi.runtime.transport; 105..114: pgc_mpi.runtime.links; 115: heartbeats; 116, 117: abandon
TAG_THRESHOLD = 118


class ThresholdAnnouncement:
    """Rank 0's side: the chosen threshold, sent to every worker rank (non-blocking)."""

    def __init__(self, comm: MPI.Comm):
        self.comm = comm
        self._buf = np.zeros(1)
        self._sends: list[MPI.Request] = []

    def send(self, threshold: float, ranks: Iterable[int]) -> None:
        """Send `threshold` to every rank in `ranks` (the buffer is kept until the sends complete)."""
        self._buf[0] = threshold
        self._sends = [self.comm.Isend([self._buf, MPI.DOUBLE], dest=rank, tag=TAG_THRESHOLD) for rank in ranks]


class ThresholdWatch:
    """A worker's side: the threshold rank 0 chose, once it has come (None before)."""

    def __init__(self, comm: MPI.Comm, fixed: float | None = None):
        """`fixed`: --drop-compute SECONDS (nothing to wait for), else None (auto)."""
        self.comm, self.value = comm, fixed
        self._buf = np.zeros(1)

    def threshold(self) -> float | None:
        """The threshold for a job beginning now: fixed, or rank 0's once it has come (inf: none)."""
        if self.value is None and self.comm.Iprobe(source=0, tag=TAG_THRESHOLD):
            self.comm.Recv([self._buf, MPI.DOUBLE], source=0, tag=TAG_THRESHOLD)
            self.value = float(self._buf[0])
        return None if self.value is None or self.value == float("inf") else self.value


def threshold_watch(comm: MPI.Comm, setting: float | str | None) -> ThresholdWatch | None:
    """A worker's watch for --drop-compute SECONDS or auto; None without --drop-compute."""
    if setting is None:
        return None
    return ThresholdWatch(comm, None if setting == AUTO else float(setting))
