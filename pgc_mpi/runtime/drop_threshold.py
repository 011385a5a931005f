"""--drop-compute auto over MPI: rank 0 tells every worker the threshold it chose.

Rank 0 (dgd's master, or ddp's monitor) chooses the threshold from its step records
(pgc_mpi.core.drop_compute.AutoThreshold) and sends it to every worker once: one float64 with
tag TAG_THRESHOLD. A worker looks for it with Iprobe when a job begins and applies it from the
first job that begins after it arrived (the jobs in between are computed whole, as in the
measured steps). inf says that keeping every micro-batch was best.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
from mpi4py import MPI

from ..core.drop_compute import AUTO, AutoThreshold, make_auto
from .tags import TAG_THRESHOLD

log = logging.getLogger("pgc_mpi")


class ThresholdChooser:
    """Rank 0's side: it observes the step records (AutoThreshold) and, once it has chosen, adds
    the choice to that step's record, logs it and sends it to every worker rank (non-blocking)."""

    def __init__(self, auto: AutoThreshold, comm: MPI.Comm, ranks: Iterable[int]):
        self.auto, self.comm, self.ranks = auto, comm, list(ranks)
        self._buf = np.zeros(1)
        self._sends: list[MPI.Request] = []  # kept, with the buffer, until the sends complete

    def observe(self, record: dict) -> None:
        """Take one step's record; the step that completes the measurement gets the choice."""
        chosen = self.auto.observe(record)
        if not chosen:
            return
        record.update(chosen)
        self._buf[0] = chosen["drop_threshold"]
        self._sends = [self.comm.Isend([self._buf, MPI.DOUBLE], dest=rank, tag=TAG_THRESHOLD) for rank in self.ranks]
        log.info("--drop-compute auto: threshold %.4g s (%.0f %% of the micro-batches, %.2fx the speed)",
                 chosen["drop_threshold"], 100 * chosen["drop_threshold_share"], chosen["drop_threshold_speedup"])


def threshold_chooser(setting: float | str | None, scheme: str, micro_batches: int, comm: MPI.Comm,
                      ranks: Iterable[int]) -> ThresholdChooser | None:
    """Rank 0's chooser for --drop-compute auto; None for a fixed threshold or none."""
    auto = make_auto(setting, scheme, micro_batches)
    return None if auto is None else ThresholdChooser(auto, comm, ranks)


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
