"""--abandon-late over MPI: the servers' "your step is decided" notices and the workers' answers.

When a server decides step t, every worker still computing for step t or older (its model is out
and its message is not back) gets a notice (tag TAG_DECIDED: the step of the model that worker
has, one per job). The worker looks for notices at its check points (pgc_mpi.core.abandon): once
every server has told it, it drops the job, answers with a header-less "abandoned" message
(TAG_ABANDONED: the step it dropped), and waits for the newest model, which the server sends at
once, as it would on the job's late message. Both messages are one int64: nothing of the job
travels, and the master's gradient buffers never see them.

The notice is tested with Iprobe at check points only, never polled: a worker pays a few
microseconds per check point and nothing between them. Where dropping costs a gradient later (a
pipelined slot past the staleness bound), the worker drops the job only where more of it is left
than one partition gradient (pgc_mpi.core.abandon.abandon_margin): pgc_mpi.runtime.worker_job.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .tags import TAG_ABANDONED, TAG_DECIDED


class Abandoned(Exception):
    """The job's step was decided without it: the worker drops the job (raised at a check point)."""


class DecidedNotices:
    """A server's side: notices to the workers still on a decided step, and their answers."""

    def __init__(self, comm: MPI.Comm, n: int, first_worker: int):
        self.comm, self.n, self.first_worker = comm, n, first_worker
        self.told = [-1] * n  # the newest step each worker has been told is decided
        self._sends: list[tuple[MPI.Request, np.ndarray]] = []
        self._answers = np.zeros((n, 1), dtype=np.int64)
        self._reqs = [self._post(i) for i in range(n)]

    def _post(self, worker: int) -> MPI.Request:
        return self.comm.Irecv([self._answers[worker], MPI.INT64_T], source=worker + self.first_worker,
                               tag=TAG_ABANDONED)

    def tell(self, decided: int, sent: list[int], busy: list[bool]) -> None:
        """Step `decided` is decided: tell every busy worker whose model is of that step or older,
        once per job (sent: the step of each worker's newest model)."""
        self._sends = [(req, buf) for req, buf in self._sends if not req.Test()]
        for i in range(self.n):
            if busy[i] and 0 <= sent[i] <= decided and self.told[i] < sent[i]:
                buf = np.array([sent[i]], dtype=np.int64)  # kept until its send completes
                self._sends.append((self.comm.Isend([buf, MPI.INT64_T], dest=i + self.first_worker,
                                                    tag=TAG_DECIDED), buf))
                self.told[i] = sent[i]

    def answers(self) -> list[tuple[int, int]]:
        """(worker, step) of every "abandoned" answer arrived since the last call."""
        done = MPI.Request.Testsome(self._reqs) or []
        got = [(i, int(self._answers[i, 0])) for i in done]
        for i in done:
            self._reqs[i] = self._post(i)
        return got

    def close(self) -> None:
        """Withdraw the posted receives (a worker that stops sends no answer any more)."""
        for req in self._reqs:
            if req != MPI.REQUEST_NULL:
                req.Cancel()
                req.Wait()


class DecidedWatch:
    """A worker's side: whether the job's step has been decided, from every server's notices."""

    def __init__(self, comm: MPI.Comm, servers: int):
        self.comm, self.servers = comm, range(servers)
        self.told = [-1] * servers  # the newest decided step each server has told of
        self._buf = np.zeros(1, dtype=np.int64)
        self._status = MPI.Status()

    def _drain(self) -> None:
        for k in self.servers:
            while self.comm.Iprobe(source=k, tag=TAG_DECIDED, status=self._status):
                self.comm.Recv([self._buf, MPI.INT64_T], source=k, tag=TAG_DECIDED)
                self.told[k] = max(self.told[k], int(self._buf[0]))

    def decided(self, step: int) -> bool:
        """Whether every server has told that step `step` is decided (notices received now)."""
        self._drain()
        return min(self.told) >= step

    def answer(self, step: int) -> None:
        """Tell every server the job for `step` is dropped (it then sends the newest model)."""
        buf = np.array([step], dtype=np.int64)
        for k in self.servers:
            self.comm.Send([buf, MPI.INT64_T], dest=k, tag=TAG_ABANDONED)

    def drain(self) -> None:
        """Receive the notices still on their way (at the end: none is left unreceived)."""
        self._drain()
