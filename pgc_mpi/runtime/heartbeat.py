"""Heartbeats: how rank 0 tells a slow worker from a gone one (pgc_mpi.runtime.lost).

Every worker sends rank 0 an 8-byte message on a tag of its own from a thread of its own, every
heartbeat_interval(lost_after) seconds, whatever its main thread is doing: a computation of any
length, an injected delay, a wait for the model. Rank 0 takes them in every poll of its
transport (Listener), and a worker's silence counts from the last beat or message it sent.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from mpi4py import MPI

from .tags import TAG_ALIVE


def heartbeat_interval(lost_after: float) -> float:
    """Seconds between a worker's heartbeats for a master that declares a worker lost after
    `lost_after` seconds of silence: four beats in that time (a beat late by a scheduling hiccup
    is not a death), and at least one a second (a death is noticed within a second of lost_after)."""
    return min(1.0, lost_after / 4)


class Heartbeat:
    """A worker's sign of life to rank 0, sent every `interval` seconds from a thread of its own.
    One beat is in flight at a time, sent synchronously (complete once rank 0 has taken it): a
    master busy for minutes then finds one beat per worker waiting, not a queue. The thread only
    wakes, tests a request and sends 8 bytes (its cost on a step: docs/BENCHMARKS.md §22)."""

    def __init__(self, comm: MPI.Comm, interval: float, poll_interval: float, master: int = 0):
        self.comm, self.interval, self.poll_interval, self.master = comm, interval, poll_interval, master
        self._buf = np.zeros(1, dtype=np.int64)
        self._req = MPI.REQUEST_NULL
        self._quiet = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="pgc-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._quiet.wait(self.interval):
            if self._req.Test():  # the previous beat has been taken (or there is none)
                self._req = self.comm.Issend([self._buf, MPI.INT64_T], dest=self.master, tag=TAG_ALIVE)

    def fall_silent(self) -> None:
        """Send no more beats (an injected hang: this worker acts as a frozen node)."""
        self._quiet.set()

    def stop(self) -> None:
        """End the beats before this worker's goodbye; the last one is taken first (rank 0 takes
        beats until the goodbye arrives), so none is left unmatched."""
        self._quiet.set()
        self._thread.join()
        while not self._req.Test():
            time.sleep(self.poll_interval)


class Listener:
    """Rank 0's receives of the workers' heartbeats: one posted per worker, taken and posted again."""

    def __init__(self, comm: MPI.Comm, n: int, first_worker: int):
        self.comm, self.first_worker = comm, first_worker
        self._beats = np.zeros((n, 1), dtype=np.int64)  # their content is unused
        self._reqs = [self._post(w) for w in range(n)]

    def _post(self, worker: int) -> MPI.Request:
        return self.comm.Irecv([self._beats[worker], MPI.INT64_T], source=worker + self.first_worker, tag=TAG_ALIVE)

    def arrived(self) -> list[int]:
        """The workers whose beat has arrived since the last call (one pass: a worker has at most
        one beat in flight, so after a long pause of the master one pass takes them all)."""
        done = MPI.Request.Testsome(self._reqs) or []
        for w in done:
            self._reqs[w] = self._post(w)
        return done

    def stop(self, worker: int) -> None:
        """Withdraw the receive of a worker that confirmed its stop (its beats have ended)."""
        req = self._reqs[worker]
        if req != MPI.REQUEST_NULL:
            req.Cancel()
            req.Wait()
            self._reqs[worker] = MPI.REQUEST_NULL
