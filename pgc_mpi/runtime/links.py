"""The control links beside the gradient transport (pgc_mpi.runtime.transport): rank 0's orders to
the other servers and their answers (--servers K: LeaderLink, FollowerLink), and the ddp
workers' reports to the watching rank 0 (PeerReporter, PeerInbox). Same communicator, tags of
their own, the same sleeping waits."""

from __future__ import annotations

import math
import time

import numpy as np
from mpi4py import MPI

from .tags import (
    TAG_DIAGNOSIS,
    TAG_ORDER,
    TAG_PARAMS,
    TAG_REPORT,
    TAG_SERVER_REPORT,
    TAG_SHARD,
    TAG_START,
    TAG_STATE,
    TAG_TABLE,
    TAG_VERDICT,
)
from .transport import Backoff, _wait


def _receive_object(comm: MPI.Comm, source: int, tag: int, poll_interval: float, until: float = math.inf):
    """A pickled message from `source`, waited for with Backoff's sleeps (a blocking receive spins a
    core in MPICH); None if time.monotonic() reached `until` first."""
    backoff = Backoff(poll_interval)
    while not comm.iprobe(source=source, tag=tag):
        if time.monotonic() >= until:
            return None
        backoff.sleep(until)
    return comm.recv(source=source, tag=tag)


class LeaderLink:
    """Rank 0's link to the other servers of --servers K (ranks 1..K-1, pgc_mpi.runtime.servers): orders
    out (four int64s: kind, steps, worker, value), their shards, optimizer states, pbs tables and
    diagnostics, and reports in."""

    def __init__(self, comm: MPI.Comm, servers: int, poll_interval: float):
        self.comm, self.poll_interval = comm, poll_interval
        self.followers = range(1, servers)
        self._orders: list[tuple[MPI.Request, np.ndarray]] = []

    def order(self, kind: int, steps: int, worker: int = -1, value: int = 0) -> None:
        """Send one order to every follower (non-blocking; the buffers live until delivered)."""
        self._orders = [(r, b) for r, b in self._orders if not r.Test()]
        buf = np.array([kind, steps, worker, value], dtype=np.int64)
        self._orders += [(self.comm.Isend([buf, MPI.INT64_T], dest=k, tag=TAG_ORDER), buf) for k in self.followers]

    def send_start(self, follower: int, start) -> None:
        """What `follower` starts from (pickled: its shard, and its part of a checkpoint)."""
        self.comm.send(start, dest=follower, tag=TAG_START)

    def receive_shards(self, parts: list[np.ndarray], tag: int = TAG_SHARD) -> None:
        """Receive every follower's shard into its part (parts[k - 1]: follower k's, contiguous
        arrays); with `tag` TAG_TABLE, its shard of the pbs table."""
        _wait([self.comm.Irecv([part, MPI.BYTE], source=k, tag=tag) for k, part in zip(self.followers, parts,
                                                                                          strict=True)],
              self.poll_interval)

    def receive_states(self) -> list:
        """Every follower's optimizer state_dict, in order (sent right after its shard)."""
        return [_receive_object(self.comm, k, TAG_STATE, self.poll_interval) for k in self.followers]

    def receive_diagnoses(self, sums: np.ndarray, nows: list[np.ndarray] | None = None,
                          olds: list[np.ndarray] | None = None) -> None:
        """Every follower's part of a pbs step's diagnostics: its partial sums into sums[k - 1]
        and, at a probe, its shards of the two probed models into nows[k - 1] and olds[k - 1]
        (contiguous arrays; a follower sends them in this order, under one tag)."""
        requests = []
        for j, k in enumerate(self.followers):
            parts = [sums[j]] + ([nows[j], olds[j]] if nows is not None else [])
            requests += [self.comm.Irecv([part, MPI.BYTE], source=k, tag=TAG_DIAGNOSIS) for part in parts]
        _wait(requests, self.poll_interval)

    def receive_reports(self, until: float) -> list:
        """Every follower's report, None for one that has not sent it by time.monotonic() == until."""
        return [_receive_object(self.comm, k, TAG_SERVER_REPORT, self.poll_interval, until) for k in self.followers]


class FollowerLink:
    """A follower server's link to rank 0 (pgc_mpi.runtime.servers): its orders in, its shard, optimizer
    state, pbs table, diagnostics and report out."""

    def __init__(self, comm: MPI.Comm, poll_interval: float):
        self.comm, self.poll_interval = comm, poll_interval
        self._buf = np.zeros(4, dtype=np.int64)
        self._req = comm.Irecv([self._buf, MPI.INT64_T], source=0, tag=TAG_ORDER)

    def orders(self) -> list[tuple[int, int, int, int]]:
        """Every order that has arrived, in order, as (kind, steps, worker, value)."""
        got = []
        while self._req.Test():
            got.append(tuple(int(v) for v in self._buf))
            self._req = self.comm.Irecv([self._buf, MPI.INT64_T], source=0, tag=TAG_ORDER)
        return got

    def receive_start(self):
        """What rank 0 said this server starts from."""
        return _receive_object(self.comm, 0, TAG_START, self.poll_interval)

    def send_shard(self, params: np.ndarray, state=None, table: np.ndarray | None = None) -> None:
        """Send this server's shard (and, given, its optimizer state and its shard of the pbs
        table's gradients) to rank 0."""
        _wait([self.comm.Isend([params, MPI.BYTE], dest=0, tag=TAG_SHARD)], self.poll_interval)
        if state is not None:
            self.comm.send(state, dest=0, tag=TAG_STATE)  # small next to the shard
        if table is not None:
            _wait([self.comm.Isend([table, MPI.BYTE], dest=0, tag=TAG_TABLE)], self.poll_interval)

    def send_diagnosis(self, sums: np.ndarray, now: np.ndarray | None = None, old: np.ndarray | None = None) -> None:
        """This server's part of a pbs step's diagnostics (LeaderLink.receive_diagnoses)."""
        parts = [sums] + ([now, old] if now is not None else [])
        _wait([self.comm.Isend([part, MPI.BYTE], dest=0, tag=TAG_DIAGNOSIS) for part in parts], self.poll_interval)

    def send_report(self, report: dict) -> None:
        """This server's end-of-run report to rank 0."""
        self.comm.send(report, dest=0, tag=TAG_SERVER_REPORT)


class PeerReporter:
    """A ddp worker's side of its link to rank 0 (pgc_mpi.runtime.ddp), which is not in the training loop.

    Reports and parameters go out with non-blocking sends from private copies, so training never
    waits for rank 0; the copies live until their sends complete. At evaluation steps the worker
    waits for rank 0's verdict (go on or stop), which keeps every worker at the same step."""

    def __init__(self, comm: MPI.Comm, poll_interval: float):
        self.comm, self.poll_interval = comm, poll_interval
        self._pending: list[tuple[MPI.Request, np.ndarray]] = []
        self._verdict = np.zeros(1)

    def send(self, data: np.ndarray, params: bool = False) -> None:
        """Send a copy of `data` (a step report, or with `params` the parameters) to rank 0."""
        buf = np.ascontiguousarray(data).copy().view(np.uint8)
        tag = TAG_PARAMS if params else TAG_REPORT
        self._pending = [(r, b) for r, b in self._pending if not r.Test()]
        self._pending.append((self.comm.Isend([buf, MPI.BYTE], dest=0, tag=tag), buf))

    def verdict(self) -> bool:
        """Wait for rank 0's verdict after an evaluation step: True to stop, False to go on."""
        _wait([self.comm.Irecv([self._verdict, MPI.DOUBLE], source=0, tag=TAG_VERDICT)], self.poll_interval)
        return bool(self._verdict[0])

    def flush(self) -> None:
        """Wait until rank 0 has received everything sent (it receives every step's messages)."""
        _wait([r for r, _ in self._pending], self.poll_interval)
        self._pending = []


class PeerInbox:
    """Rank 0's side of the ddp baseline's links: one report per worker and step, the parameters from
    worker 0 when asked for, and the verdicts rank 0 sends back at evaluation steps."""

    def __init__(self, comm: MPI.Comm, n: int, reports: np.ndarray, params: np.ndarray, poll_interval: float):
        """`reports`: n rows, one worker's report each (any dtype: received as bytes); `params`: the
        buffer the parameters land in."""
        self.comm, self.n, self.poll_interval = comm, n, poll_interval
        self.reports, self.params = reports, params
        self._verdicts: list[tuple[MPI.Request, np.ndarray]] = []

    def collect(self, with_params: bool, stop) -> bool:
        """Receive the next report of every worker (and the parameters, `with_params`); False when
        `stop()` turned true first (the receives are then left posted: the caller ends the job)."""
        rows = self.reports.view(np.uint8).reshape(self.n, -1)
        reqs = [self.comm.Irecv([rows[i], MPI.BYTE], source=i + 1, tag=TAG_REPORT) for i in range(self.n)]
        if with_params:
            reqs.append(self.comm.Irecv([self.params.view(np.uint8), MPI.BYTE], source=1, tag=TAG_PARAMS))
        return _wait(reqs, self.poll_interval, stop)

    def send_verdict(self, stop: bool) -> None:
        """Tell every worker whether to stop after this evaluation step (non-blocking)."""
        buf = np.array([float(stop)])
        self._verdicts = [(r, b) for r, b in self._verdicts if not r.Test()]
        self._verdicts += [(self.comm.Isend([buf, MPI.DOUBLE], dest=i + 1, tag=TAG_VERDICT), buf)
                           for i in range(self.n)]

    def flush(self) -> None:
        """Wait until every worker has received its verdicts."""
        _wait([r for r, _ in self._verdicts], self.poll_interval)
        self._verdicts = []
