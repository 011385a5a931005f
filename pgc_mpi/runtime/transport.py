"""The gradient transport over MPI: the communicator, message buffers and requests of the models
and gradients between the servers and the workers (the tags: pgc_mpi.runtime.tags).

Every message is one contiguous byte buffer laid out by pgc_mpi.core.message: a header of named
fields followed by the payload (parameters in the run's dtype, or a coded gradient in the wire
format: pgc_mpi.core.wire). The master
receives into one preallocated buffer per worker, polls them with Testsome plus a short sleep
(never a busy spin, never a wait that cannot time out), and keeps at most one model message in
flight per worker, sent from a snapshot so the master can update its parameters meanwhile.

With --servers K every server has its MasterTransport over its shard, the workers send each
server its part, and rank 0 talks to the other servers through LeaderLink/FollowerLink (orders,
shards, optimizer states, reports: pgc_mpi.runtime.servers says what they mean).

The ddp baseline (pgc_mpi.runtime.ddp) averages its gradients over torch.distributed, not here; its
links to rank 0 (PeerReporter, PeerInbox) carry only step reports, parameters and verdicts.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import NoReturn

import numpy as np
from mpi4py import MPI

from ..core.message import MODEL_HEADER, Layout
from ..core.wire import WireFormat, wire_format
from .abandon import DecidedNotices
from .heartbeat import Heartbeat, Listener
from .tags import TAG_BYE, TAG_GRAD, TAG_MODEL, TAG_STOP


class Backoff:
    """The sleeps of one polling wait: they start at FLOOR and double up to `ceiling` (the
    configured poll interval). A message about to land is seen within tens of microseconds, a
    long wait costs a few wake-ups more than fixed sleeps, and no loop ever spins: ranks often
    share cores with the workers they wait for (a spinning master slowed them 25-29%)."""

    FLOOR = 50e-6

    def __init__(self, ceiling: float):
        self.ceiling = ceiling
        self.delay = min(self.FLOOR, ceiling)

    def sleep(self, until: float = math.inf) -> None:
        """Sleep the current delay (never past time.monotonic() == until), then double it."""
        time.sleep(max(0.0, min(self.delay, until - time.monotonic())))
        self.delay = min(2 * self.delay, self.ceiling)


def _sleep_until(seconds: float, until: float) -> None:
    """Sleep `seconds`, but never past time.monotonic() == until (a shutdown's grace is a bound)."""
    time.sleep(max(0.0, min(seconds, until - time.monotonic())))


def duplicate_world(comm: MPI.Comm | None = None) -> MPI.Comm:
    """Our own communicator, so our messages never match the user's (COMM_WORLD's) ones. The ranks
    that arrive first sleep until the last one has (wait_for_all): ranks start together, and
    early ones spinning in the Dup would slow down the imports of the others."""
    comm = comm if comm is not None else MPI.COMM_WORLD
    wait_for_all(comm)
    return comm.Dup()


# Longest sleep of wait_for_all between two tests of its barrier.
START_POLL = 0.01


def wait_for_all(comm: MPI.Comm) -> None:
    """A barrier waited with Backoff's sleeps (`barrier`), for the start-up's collectives: MPICH's
    blocking ones spin, and workers spinning while they wait for rank 0 (importing torch, reading
    data) take the cores it needs when ranks share them (measured: most of the start-up time of
    many light ranks on a few cores). Call it before a collective that waits for rank 0's work."""
    barrier(comm, START_POLL)


def abort(code: int) -> NoReturn:
    """End every rank of the job now with `code` (MPICH returns from Abort briefly: exit hard after it).

    The whole job is meant, so this is the one place that uses COMM_WORLD: MPICH's mpiexec
    reports the code given to Abort on the world communicator (9 for a duplicate).
    """
    from ..runs.run_lock import release_all

    release_all()  # rank 0's lock on the run folder: MPI_Abort skips every clean-up
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.5)  # let mpiexec forward what the ranks printed: an abort can drop output in transit
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)


class _Snapshot:
    """A copy of the parameters that model messages are sent from, and the sends still using it."""

    def __init__(self, layout: Layout):
        self.buf = layout.allocate()[0]
        self.header, self.payload = layout.split(self.buf)
        self.pending: list[MPI.Request] = []

    def free(self) -> bool:
        self.pending = [r for r in self.pending if not r.Test()]
        return not self.pending


class MasterTransport:
    """A server's side: model sends to and gradient receives from workers 0..n-1 (ranks
    first_worker..first_worker+n-1: 1..n with one server, K.. with --servers K)."""

    def __init__(self, comm: MPI.Comm, n: int, grad_layout: Layout, poll_interval: float,
                 wire: WireFormat | None = None, first_worker: int = 1):
        """`grad_layout`: the messages this server receives (its shard, with --servers); `wire`: the
        gradients' format on the wire (default: grad_layout's dtype, nothing rounded); models go
        out in its compute dtype."""
        self.comm, self.n, self.poll_interval = comm, n, poll_interval
        self.first_worker = first_worker
        self.grad_layout = grad_layout
        self.wire = wire or wire_format(None, grad_layout.dtype)
        self.model_layout = Layout(MODEL_HEADER, grad_layout.dim, self.wire.compute)
        self.recv = grad_layout.allocate(n)  # one contiguous row per worker: no aliasing
        views = [grad_layout.split(row) for row in self.recv]
        self.headers = [h for h, _ in views]
        self.payloads = [p for _, p in views]
        self._widened: list[np.ndarray | None] = [None] * n  # each worker's payload in the run's dtype
        self._reqs: list[MPI.Request] = [MPI.REQUEST_NULL] * n
        self._statuses = [MPI.Status() for _ in range(n)]
        self.malformed: list[tuple[int, str]] = []  # (worker, reason), for the master to count and log
        self._model_reqs: list[MPI.Request] = [MPI.REQUEST_NULL] * n
        self._snapshots: list[_Snapshot] = []
        self._current: _Snapshot | None = None
        self.bytes_received = 0
        # when each worker was last heard from (a message or a heartbeat), and when the master last
        # polled: the lost workers' clock (pgc_mpi.runtime.lost) and shutdown's test of life
        self.heard = [time.monotonic()] * n
        self._last_poll = time.monotonic()
        self.beats: Listener | None = None  # rank 0's receives of the heartbeats (listen_for_heartbeats)
        # --abandon-late (pgc_mpi.runtime.abandon): the notices, and the (worker, step) of the jobs
        # dropped since the master last looked (a poll returns when one comes, as for a gradient)
        self.notices: DecidedNotices | None = None
        self.abandoned: list[tuple[int, int]] = []

    def gradient(self, worker: int) -> np.ndarray:
        """The payload of `worker`'s message in the run's dtype: the receive buffer itself, or, with a
        narrower wire format, the buffer widened into one of that worker's own (valid until its next
        message is widened: a held payload is released before the worker's next receive is posted)."""
        if not self.wire.narrowed:
            return self.payloads[worker]
        if self._widened[worker] is None:
            self._widened[worker] = np.empty(self.grad_layout.dim, dtype=self.wire.compute)
        return self.wire.decode(self.payloads[worker], out=self._widened[worker])

    def post(self, worker: int) -> None:
        """(Re)post the receive of `worker`'s next gradient into its buffer."""
        self._reqs[worker] = self.comm.Irecv([self.recv[worker], MPI.BYTE], source=worker + self.first_worker,
                                             tag=TAG_GRAD)

    def listen_for_heartbeats(self) -> None:
        """Receive the workers' heartbeats from now on (rank 0, which declares workers lost): every
        poll takes them, and the silence of a worker counts from now."""
        self.heard = [time.monotonic()] * self.n
        self.beats = Listener(self.comm, self.n, self.first_worker)

    def poll(self, until: float) -> list[int]:
        """Workers whose gradient has arrived, waiting at most until time.monotonic() == until."""
        backoff = Backoff(self.poll_interval)
        while True:
            good = self._completed()
            self._last_poll = time.monotonic()
            if good or self.abandoned:
                self.bytes_received += len(good) * self.grad_layout.nbytes
                return good
            if self._last_poll >= until:
                return []
            backoff.sleep(until)

    def _completed(self) -> list[int]:
        """Workers whose receive has completed with a well-formed message (one Testsome pass).

        A message of the wrong size never reaches the master's buffers' users: a larger one is
        truncated by MPI (an error in its status), a smaller one is caught by its byte count.
        Either is recorded in `malformed` as (worker, reason), its receive is posted again, and
        it is not returned.
        """
        active = [r != MPI.REQUEST_NULL for r in self._reqs]
        for st in self._statuses:
            st.Set_source(-1)
            st.Set_error(MPI.SUCCESS)
        try:
            done = MPI.Request.Testsome(self._reqs, self._statuses) or []
        except MPI.Exception:  # a message in error (truncated): the completed ones are now null
            done = [i for i, r in enumerate(self._reqs) if active[i] and r == MPI.REQUEST_NULL]
        by_source = {st.Get_source(): st for st in self._statuses if st.Get_source() >= self.first_worker}
        good = []
        now = time.monotonic()
        if self.beats is not None:
            for i in self.beats.arrived():
                self.heard[i] = now
        if self.notices is not None:
            for i, step in self.notices.answers():
                self.heard[i] = now
                self.abandoned.append((i, step))
        for i in done:
            self.heard[i] = now
            st = by_source.get(i + self.first_worker)
            if st is not None and st.Get_error() != MPI.SUCCESS:
                self.malformed.append((i, "message larger than expected (truncated)"))
                self.post(i)
            elif st is not None and st.Get_count(MPI.BYTE) != self.grad_layout.nbytes:
                self.malformed.append((i, f"message of {st.Get_count(MPI.BYTE)} bytes, expected "
                                          f"{self.grad_layout.nbytes}"))
                self.post(i)
            else:
                good.append(i)
        return good

    def publish(self, step: int, w: np.ndarray) -> None:
        """Copy the parameters of `step` into a snapshot that the next model sends use."""
        snap = next((s for s in self._snapshots if s.free()), None)
        if snap is None:
            snap = _Snapshot(self.model_layout)
            self._snapshots.append(snap)
        snap.header["step"] = step
        np.copyto(snap.payload, w, casting="same_kind")
        self._current = snap

    def send_model(self, worker: int) -> None:
        """Send the published model to `worker` (non-blocking)."""
        snap = self._current
        assert snap is not None, "publish() a model before sending it"
        req = self.comm.Isend([snap.buf, MPI.BYTE], dest=worker + self.first_worker, tag=TAG_MODEL)
        snap.pending.append(req)
        self._model_reqs[worker] = req

    def model_in_flight(self, worker: int) -> bool:
        """Whether the last model sent to `worker` has not been received yet."""
        return not self._model_reqs[worker].Test()

    def shutdown(self, grace: float) -> list[int]:
        """Tell every worker to stop and wait up to `grace` s for each to confirm.

        Models still in flight are delivered first (a stop could overtake a large model and
        leave its send pending forever). Gradient receives stay posted until a worker confirms,
        so a straggler's last message always has somewhere to land (a cancelled receive can
        deadlock its large send). A worker silent for more than `grace` before the master's last
        poll (the end of training: a final evaluation may follow) is not sent a stop: it could
        not confirm within the grace anyway unless just about to, and when its node is gone
        (off the network), a message to it can crash MPICH. Returns the workers that never
        confirmed (hung, or their node gone), silent ones included; the caller must then abort,
        not finalize.
        """
        self._repost_arrived()  # what arrived since the last poll is a sign of life too
        until = time.monotonic() + grace
        alive = [w for w in range(self.n) if self._last_poll - self.heard[w] <= grace]
        while any(self.model_in_flight(w) for w in alive) and time.monotonic() < until:
            self._repost_arrived()
            _sleep_until(self.poll_interval, until)
        self._stop_buf = np.zeros(1)
        self._bye_buf = np.zeros((self.n, 1))
        first = self.first_worker
        self._stops = [self.comm.Isend([self._stop_buf, MPI.DOUBLE], dest=w + first, tag=TAG_STOP) for w in alive]
        byes = [self.comm.Irecv([self._bye_buf[w], MPI.DOUBLE], source=w + first, tag=TAG_BYE) for w in alive]
        confirmed: set[int] = set()
        while len(confirmed) < len(alive) and time.monotonic() < until:
            self._repost_arrived()
            for i in MPI.Request.Testsome(byes) or []:
                w = alive[i]
                confirmed.add(w)
                if self._reqs[w] != MPI.REQUEST_NULL:  # it will send nothing more: withdraw the receive
                    self._reqs[w].Cancel()
                    self._reqs[w].Wait()
                if self.beats is not None:  # its beats ended before its goodbye
                    self.beats.stop(w)
            if len(confirmed) < len(alive):
                _sleep_until(self.poll_interval, until)
        if self.notices is not None:
            self.notices.close()
        return sorted(set(range(self.n)) - confirmed)

    def _repost_arrived(self) -> None:
        """Discard gradients that arrive while stopping (well-formed or not), keeping a receive ready."""
        for w in self._completed():
            self.post(w)


class WorkerTransport:
    """A worker's side: receive the newest model, send coded gradients, notice the stop.

    With --servers K (`shards`: the K slices of the parameter vector, server k at rank k) a model
    is K shard messages and a gradient message K shard messages with the same header, one per
    server; with one server both are single messages sent and received in place."""

    def __init__(self, comm: MPI.Comm, grad_layout: Layout, poll_interval: float, wire: WireFormat | None = None,
                 shards: list[slice] | None = None, heartbeat: float | None = None):
        """`grad_layout`: the whole message (header and every parameter); `wire`: the gradients'
        format on the wire (default: grad_layout's dtype, nothing rounded); models arrive in its
        compute dtype; `heartbeat`: seconds between this worker's heartbeats to rank 0 (None: none)."""
        self.comm, self.poll_interval = comm, poll_interval
        self.wire = wire or wire_format(None, grad_layout.dtype)
        self.shards = shards or [slice(0, grad_layout.dim)]
        self.servers = range(len(self.shards))
        sizes = [len(range(grad_layout.dim)[shard]) for shard in self.shards]
        model_layouts = [Layout(MODEL_HEADER, size, self.wire.compute) for size in sizes]
        self._model_bufs = [layout.allocate()[0] for layout in model_layouts]
        self._model_parts = [layout.split(buf) for layout, buf in zip(model_layouts, self._model_bufs, strict=True)]
        grad_layouts = [Layout(grad_layout.header, size, grad_layout.dtype) for size in sizes]
        self._send_bufs = [layout.allocate()[0] for layout in grad_layouts]
        parts = [layout.split(buf) for layout, buf in zip(grad_layouts, self._send_bufs, strict=True)]
        self.headers = [h for h, _ in parts]
        self.payloads = [p for _, p in parts]  # each server's part of the message, in the wire format
        self.nbytes = grad_layouts[0].nbytes
        self.sharded = len(self.shards) > 1
        # the model's parameters: server 0's message payload itself, or the shards copied together
        self.model = np.empty(grad_layout.dim, self.wire.compute) if self.sharded else self._model_parts[0][1]
        # where the coded gradient is computed: the message payload itself when nothing is rounded or cut
        in_place = not self.sharded and not self.wire.narrowed
        self.coded = self.payloads[0] if in_place else np.empty(grad_layout.dim, self.wire.compute)
        self._fresh: list[int | None] = [None] * len(self.shards)  # each server's newest shard not yet used
        self._stopping: set[int] = set()  # the servers whose stop has been received
        self.shard_steps: list[int] = []  # the step of each server's shard in the model last taken
        self._status = MPI.Status()
        self.stopped = False
        self.heartbeat = Heartbeat(comm, heartbeat, poll_interval) if heartbeat is not None else None

    def _drain(self, server: int) -> bool:
        """Receive every model shard `server` has sent (the newest stays); True when its stop is next."""
        misses = 0
        while misses < 3:  # a few probes: one progress call may not surface every message
            # by tag: a server sends other messages too (--abandon-late's notices, taken at check points)
            if self.comm.Iprobe(source=server, tag=TAG_MODEL, status=self._status):
                self.comm.Recv([self._model_bufs[server], MPI.BYTE], source=server, tag=TAG_MODEL)
                self._fresh[server], misses = int(self._model_parts[server][0]["step"]), 0
            elif self.comm.Iprobe(source=server, tag=TAG_STOP):  # never followed by a model
                return True
            else:
                misses += 1
        return False

    def next_model(self, block: bool = True) -> int | None:
        """Step of the newest model received (older pending ones are drained), or None.

        Returns None when a server asked to stop (then `stopped` is True), or when nothing new
        arrived and block is False; `self.model` holds the parameters. With K servers the model
        is ready once every server has sent a new shard; its step is the oldest of theirs (they
        agree unless this worker was a straggler: a newer shard is then used early, and the
        message counts as of the older step everywhere). The servers keep at most one model in
        flight per worker, so draining is a safety net: MPI only promises that a sent message
        becomes visible to Iprobe eventually, not at once.
        """
        self.stopped = False
        backoff = Backoff(self.poll_interval)
        while True:
            stops = [k for k in self.servers if self._drain(k)]
            if all(step is not None for step in self._fresh):  # a model before a stop that follows it
                return self._take_model()
            if stops:
                for k in stops:
                    self._receive_stop(k)
                self.stopped = True
                return None
            if not block:
                return None
            backoff.sleep()

    def _take_model(self) -> int:
        self.shard_steps = list(self._fresh)  # each server's step of the shard taken (pbs checks they agree)
        step = min(self._fresh)
        if self.sharded:
            for shard, (_, payload) in zip(self.shards, self._model_parts, strict=True):
                self.model[shard] = payload
        self._fresh = [None] * len(self.shards)
        return step

    def _receive_stop(self, server: int) -> None:
        self.comm.Recv([np.zeros(1), MPI.DOUBLE], source=server, tag=TAG_STOP)
        self._stopping.add(server)

    def stop_requested(self) -> bool:
        """Whether a stop message is waiting (used to cut injected delays short)."""
        return any(self.comm.Iprobe(source=k, tag=TAG_STOP) for k in self.servers)

    def put(self, values: np.ndarray) -> None:
        """Put the coded gradient `values` into the message payloads, in the wire format (nothing to
        do when it was computed in place: `values` is `self.coded` with one server and no rounding)."""
        if values is self.payloads[0]:
            return
        for shard, payload in zip(self.shards, self.payloads, strict=True):
            self.wire.encode(values[shard], payload)

    def write_header(self, message) -> None:
        """Write the message's header (a pgc_mpi.core.message.Message) into every server's part."""
        for header in self.headers:
            message.write(header)

    def send(self, nbytes: int | None = None) -> None:
        """Send the gradient message to every server, politely waiting for completion.
        (`nbytes` other than the message size is for fault injection only.)"""
        bufs = self._send_bufs if nbytes is None else [np.zeros(nbytes, dtype=np.uint8)] * len(self.shards)
        _wait([self.comm.Isend([buf, MPI.BYTE], dest=k, tag=TAG_GRAD) for k, buf in zip(self.servers, bufs,
                                                                                         strict=True)],
              self.poll_interval)

    def fall_silent(self) -> None:
        """Stop the heartbeats for good (an injected hang)."""
        if self.heartbeat is not None:
            self.heartbeat.fall_silent()

    def confirm_stop(self) -> None:
        """Tell every server this worker is done and will send nothing more, once every one of them
        has said stop (model shards sent before a server's stop are received and dropped meanwhile:
        a server's shutdown waits for them to be delivered), and its heartbeats have ended."""
        backoff = Backoff(self.poll_interval)
        while len(self._stopping) < len(self.shards):
            for k in set(self.servers) - self._stopping:
                if self._drain(k):
                    self._receive_stop(k)
            backoff.sleep()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        for k in self.servers:
            self.comm.Send([np.zeros(1), MPI.DOUBLE], dest=k, tag=TAG_BYE)


def _wait(requests: list[MPI.Request], poll_interval: float, stop=lambda: False) -> bool:
    """Wait for every request with Backoff's sleeps (never a spin); False if `stop()` turned true first."""
    backoff = Backoff(poll_interval)
    while not MPI.Request.Testall(requests):
        if stop():
            return False
        backoff.sleep()
    return True


def barrier(comm: MPI.Comm, poll_interval: float, stop=lambda: False) -> bool:
    """A barrier over `comm` waited with Backoff's sleeps (a blocking MPI barrier spins a core in
    MPICH); False if `stop()` turned true first."""
    return _wait([comm.Ibarrier()], poll_interval, stop)
