"""--servers K: the parameter vector split into K contiguous shards, one per server rank.

Ranks 0..K-1 are servers, ranks K..K+N-1 the workers. Every worker sends each server the
server's shard of its coded message (the same header to all), and every server runs the
master's step loop (pgc_mpi.master) on its shard alone: it decodes from its own arrivals with
the scheme's rule, applies the optimizer to its shard (every optimizer here is elementwise, so
K shards updated apart are the one vector updated whole) and sends its shard of the new model.
A worker computes once it has a new shard from every server (pgc_mpi.transport.WorkerTransport).

Rank 0, the leader, still alone decides everything about the run as a whole: evaluations,
checkpoints, the target loss, signals and the end. The others (followers) obey it through one
small control message at a time (`Leader` here, `FollowerControl` there):

- COMMIT t: apply step t's update. A follower decodes step t on its own but applies it only
  after this, so that a stop rank 0 takes during step t (a signal) never finds a follower a step
  ahead: the run's state is always that of a whole number of steps on every shard.
- GATHER d (with or without the optimizer state): send your shard once you have applied d
  steps; rank 0 assembles the whole vector for an evaluation, a checkpoint or --record-params.
- END d: the run ended after d steps: abandon the step in progress, report, shut down.

Servers may decode a step from different arrival sets (the messages reach them in different
orders); each shard is still decoded by the scheme's rule from messages of that step, see
docs/ALGORITHMS.md.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from .checkpoint import Checkpoint
from .errors import ConfigError
from .transport import Backoff

TAG_CONTROL, TAG_SHARD, TAG_STATE, TAG_START, TAG_SERVER_REPORT = 111, 112, 113, 114, 115
COMMIT, GATHER, GATHER_STATE, END = 1, 2, 3, 4


def shard_bounds(dim: int, servers: int) -> list[slice]:
    """The K contiguous shards of a `dim`-vector, as equal as can be (the first ones one longer)."""
    if servers > dim:
        raise ConfigError(f"--servers {servers} is more than the model's {dim} parameters: every server holds at "
                          f"least one; use --servers {dim} or fewer")
    base, extra = divmod(dim, servers)
    bounds, lo = [], 0
    for k in range(servers):
        hi = lo + base + (k < extra)
        bounds.append(slice(lo, hi))
        lo = hi
    return bounds


def slice_state(state: dict[str, Any], shard: slice, dim: int) -> dict[str, Any]:
    """A torch optimizer's state_dict for the shard of a `dim`-vector: its per-parameter vectors
    (momentum, Adam's moments) cut to the shard, its scalars (Adam's step) and groups kept."""
    per_param = state["state"].get(0, {})
    cut = {key: value[shard].clone() if torch.is_tensor(value) and value.dim() == 1 and len(value) == dim else value
           for key, value in per_param.items()}
    return {"state": {0: cut} if cut else {}, "param_groups": state["param_groups"]}


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The optimizer state_dict of the whole vector from its shards' (in shard order)."""
    first = states[0]["state"].get(0, {})
    merged = {key: torch.cat([s["state"][0][key] for s in states]) if torch.is_tensor(value) and value.dim() == 1
              else value for key, value in first.items()}
    return {"state": {0: merged} if merged else {}, "param_groups": states[0]["param_groups"]}


def receive_object(comm: MPI.Comm, source: int, tag: int, poll_interval: float, until: float = math.inf) -> Any:
    """A pickled message from `source`, waited for with Backoff's sleeps (a blocking receive spins a
    core in MPICH); None if time.monotonic() reached `until` first."""
    backoff = Backoff(poll_interval)
    while not comm.iprobe(source=source, tag=tag):
        if time.monotonic() >= until:
            return None
        backoff.sleep(until)
    return comm.recv(source=source, tag=tag)


def _wait(requests: list[MPI.Request], poll_interval: float, until: float = math.inf) -> bool:
    """Wait for every request with Backoff's sleeps; False if time.monotonic() reached `until` first."""
    backoff = Backoff(poll_interval)
    while not MPI.Request.Testall(requests):
        if time.monotonic() >= until:
            return False
        backoff.sleep(until)
    return True


class Leader:
    """Rank 0's side: orders to the followers (ranks 1..K-1), their shards gathered into the whole vector."""

    def __init__(self, comm: MPI.Comm, shards: list[slice], poll_interval: float):
        self.comm, self.shards, self.poll_interval = comm, shards, poll_interval
        self.followers = range(1, len(shards))
        self._orders: list[tuple[MPI.Request, np.ndarray]] = []

    def _order(self, kind: int, steps: int) -> None:
        """Send one order to every follower (non-blocking; the buffers live until delivered)."""
        self._orders = [(r, b) for r, b in self._orders if not r.Test()]
        buf = np.array([kind, steps], dtype=np.int64)
        self._orders += [(self.comm.Isend([buf, MPI.INT64_T], dest=k, tag=TAG_CONTROL), buf) for k in self.followers]

    def start(self, w: np.ndarray, resume: Checkpoint | None) -> None:
        """Hand every follower its shard of the initial parameters, and of the checkpoint resumed from."""
        for k in self.followers:
            shard = self.shards[k]
            part = None if resume is None else dataclasses.replace(
                resume, params=resume.params[shard].copy(), optimizer=slice_state(resume.optimizer, shard, len(w)))
            self.comm.send((w[shard].copy(), part), dest=k, tag=TAG_START)

    def commit(self, step: int) -> None:
        """Step `step` is done on rank 0: the followers may apply it."""
        self._order(COMMIT, step)

    def gather(self, w: np.ndarray, steps: int, state: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Fill the followers' shards of `w` as they are after `steps` steps; with `state` (rank 0's
        own optimizer state_dict), return the whole vector's."""
        self._order(GATHER_STATE if state is not None else GATHER, steps)
        recvs = [self.comm.Irecv([w[self.shards[k]], MPI.BYTE], source=k, tag=TAG_SHARD) for k in self.followers]
        _wait(recvs, self.poll_interval)
        if state is None:
            return None
        return merge_states([state, *(receive_object(self.comm, k, TAG_STATE, self.poll_interval)
                                      for k in self.followers)])

    def end(self, steps: int, grace: float) -> list[dict[str, Any]]:
        """The run ended after `steps` steps: tell the followers, and return their reports (what each
        received), waiting at most `grace` seconds for each."""
        self._order(END, steps)
        reports = [receive_object(self.comm, k, TAG_SERVER_REPORT, self.poll_interval, time.monotonic() + grace)
                   for k in self.followers]
        return [report or {"server": k, "report": f"none within --grace {grace:g} s"}
                for k, report in zip(self.followers, reports, strict=True)]


class FollowerControl:
    """A follower's RunControl (the interface pgc_mpi.master.Master reads): rank 0 decides, this obeys.

    It never evaluates or checkpoints; it applies step t only once rank 0 committed it, answers
    rank 0's gathers once it has applied as many steps as asked, and ends the loop at END."""

    eval_seconds = 0.0
    stopped_by = None

    def __init__(self, comm: MPI.Comm, poll_interval: float):
        self.comm, self.poll_interval = comm, poll_interval
        self.committed = -1  # the newest step rank 0 committed
        self.applied = 0  # steps applied here
        self.ended: int | None = None  # the run's steps, once rank 0 said END
        self._gathers: list[tuple[int, bool]] = []  # (steps, with state) asked for and not yet answered
        self._buf = np.zeros(2, dtype=np.int64)
        self._req = self.comm.Irecv([self._buf, MPI.INT64_T], source=0, tag=TAG_CONTROL)
        self._params: np.ndarray | None = None
        self._optimizer: torch.optim.Optimizer | None = None

    def receive_start(self) -> tuple[np.ndarray, Checkpoint | None]:
        """(this shard's initial parameters, its part of the checkpoint resumed from or None), from rank 0."""
        return receive_object(self.comm, 0, TAG_START, self.poll_interval)

    def attach(self, params: np.ndarray, optimizer: torch.optim.Optimizer, applied: int) -> None:
        """What gathers send: the shard's parameters and optimizer, which have applied `applied` steps."""
        self._params, self._optimizer, self.applied = params, optimizer, applied
        self.committed = applied - 1

    def _pump(self) -> None:
        """Read every order that has arrived, and answer the gathers that can be answered now."""
        while self._req.Test():
            kind, steps = (int(v) for v in self._buf)
            if kind == COMMIT:
                self.committed = steps
            elif kind in (GATHER, GATHER_STATE):
                self._gathers.append((steps, kind == GATHER_STATE))
            elif kind == END:
                self.ended = steps
            self._req = self.comm.Irecv([self._buf, MPI.INT64_T], source=0, tag=TAG_CONTROL)
        while self._gathers and self._gathers[0][0] == self.applied:
            _, with_state = self._gathers.pop(0)
            _wait([self.comm.Isend([self._params, MPI.BYTE], dest=0, tag=TAG_SHARD)], self.poll_interval)
            if with_state:
                self.comm.send(self._optimizer.state_dict(), dest=0, tag=TAG_STATE)  # small next to the shard

    def stop_signal(self, step: int) -> bool:
        """Whether rank 0 ended the run before step `step` (which is then abandoned)."""
        self._pump()
        return self.ended is not None and step >= self.ended

    def may_update(self, step: int) -> bool:
        """Wait until rank 0 committed step `step` (True) or ended the run before it (False)."""
        backoff = Backoff(self.poll_interval)
        while not self.stop_signal(step):
            if self.committed >= step:
                return True
            backoff.sleep()
        return False

    def checkpoint_due(self, done: int) -> bool:
        """Never: rank 0 checkpoints the whole vector (gathering this shard)."""
        return False

    def checkpoint_at_end(self) -> bool:
        """Never (see checkpoint_due)."""
        return False

    def after_step(self, step: int, train_loss: float) -> bool:
        """Step `step` is applied here: answer the gathers waiting for it; True once rank 0 ended the run."""
        self.applied = step + 1
        return self.stop_signal(step + 1)

    def wait_for_end(self) -> None:
        """Serve rank 0's gathers until it ends the run (after this shard's loop stopped on its own)."""
        backoff = Backoff(self.poll_interval)
        while self.ended is None:
            self._pump()
            backoff.sleep()

    def report(self, totals, bytes_received: int, server: int) -> None:
        """Tell rank 0 what this server received and did (its summary's `servers`)."""
        self.comm.send(server_report(server, totals, bytes_received), dest=0, tag=TAG_SERVER_REPORT)


def server_report(server: int, totals, bytes_received: int) -> dict[str, Any]:
    """What one server received and did (a pgc_mpi.master.RunTotals): an entry of the summary's `servers`."""
    return {"server": server, "steps": totals.steps, "bytes_received": bytes_received,
            "stragglers_skipped": totals.skipped, "late_messages": totals.late, "rejected_stale": totals.rejected,
            "deadline_missed": totals.deadline_missed}
