"""--servers K: the parameter vector split into K contiguous shards, one per server rank.

Ranks 0..K-1 are servers, ranks K..K+N-1 the workers. Every worker sends each server the
server's shard of its coded message (the same header to all), and every server runs the
master's step loop (pgc_mpi.runtime.master) on its shard alone: it decodes from its own arrivals with
the scheme's rule, applies the optimizer to its shard (every optimizer here is elementwise, so
K shards updated apart are the one vector updated whole) and sends its shard of the new model.
A worker computes once it has a new shard from every server (pgc_mpi.runtime.transport.WorkerTransport).

Rank 0, the leader, still alone decides everything about the run as a whole: evaluations,
checkpoints, the target loss, signals and the end. The others (followers) obey it through one
small control message at a time (`Leader` here, `FollowerControl` there), of four numbers
(kind, steps, worker, value):

- COMMIT t (value: the learning rate's float64 bits): apply step t's update, with rank 0's
  learning rate for it (--adapt changes it). A follower decodes step t on its own but applies it
  only after this, so that a stop rank 0 takes during step t (a signal) never finds a follower
  a step ahead: the run's state is always that of a whole number of steps on every shard.
- GATHER d (with or without the optimizer state, and pbs's table): send your shard once you
  have applied d steps; rank 0 assembles the whole vector for an evaluation, a checkpoint or
  --record-params.
- END d: the run ended after d steps: abandon the step in progress, report, shut down.

Servers of a coded scheme may decode a step from different arrival sets (the messages reach
them in different orders); each shard is still decoded by the scheme's rule from messages of
that step, see docs/ALGORITHMS.md.

pbs cannot work that way: its table, and so when it steps and which model answers a message,
depend on the order of the arrivals. With pbs rank 0 alone sees the order, and the followers
repeat it (`follows_arrivals`): three more orders name every event of rank 0's loop that touches
the table or a worker, in the order rank 0 met them:

- ARRIVAL (steps: the message's step, worker, value 1 if rank 0 offered it to its table, 0 if it
  refused it before: malformed, misaddressed, non-finite): take that worker's next message
  (waiting for it if it has not come) and do the same with it;
- ANSWER (steps: the model's step, worker): send that worker your shard of the current model;
- DECODE t (value: the version of the probe's old model, -1 without a probe): step t decodes
  now; decode your shard and send rank 0 your part of the step's diagnostics (partial sums, and
  at a probe your shards of the two models probed).

A follower then holds rank 0's table on its shard after every event, decodes at the same
points, and answers every message with its shard of the same model: K servers follow one
server's trajectory (to rounding), and every worker's K shards are of one step.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PgcError
from .links import TAG_TABLE, FollowerLink, LeaderLink
from .transport import Backoff

if TYPE_CHECKING:  # importing this module loads no torch (slice_state and merge_states import it when they run)
    import torch

    from ..runs.checkpoint import Checkpoint

# rank 0's orders to the other servers (transport.LeaderLink.order); the last three with pbs only
COMMIT, GATHER, GATHER_STATE, END, ARRIVAL, ANSWER, DECODE = 1, 2, 3, 4, 5, 6, 7
# the orders a pbs follower's step loop carries out in sequence (FollowerControl.next_event), with
# the gathers in their place among them; the others act as soon as they are read
EVENTS = (ARRIVAL, ANSWER, DECODE)


def float_bits(value: float) -> int:
    """A float64 as the int64 with its bits (how a learning rate travels in an order)."""
    return int(np.array([value], dtype=np.float64).view(np.int64)[0])


def bits_float(bits: int) -> float:
    """The float64 whose bits `bits` are (float_bits' inverse)."""
    return float(np.array([bits], dtype=np.int64).view(np.float64)[0])


def slice_state(state: dict[str, Any], shard: slice, dim: int) -> dict[str, Any]:
    """A torch optimizer's state_dict for the shard of a `dim`-vector: its per-parameter vectors
    (momentum, Adam's moments) cut to the shard, its scalars (Adam's step) and groups kept."""
    import torch

    per_param = state["state"].get(0, {})
    cut = {key: value[shard].clone() if torch.is_tensor(value) and value.dim() == 1 and len(value) == dim else value
           for key, value in per_param.items()}
    return {"state": {0: cut} if cut else {}, "param_groups": state["param_groups"]}


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The optimizer state_dict of the whole vector from its shards' (in shard order)."""
    import torch

    first = states[0]["state"].get(0, {})
    merged = {key: torch.cat([s["state"][0][key] for s in states]) if torch.is_tensor(value) and value.dim() == 1
              else value for key, value in first.items()}
    return {"state": {0: merged} if merged else {}, "param_groups": states[0]["param_groups"]}


class Leader:
    """Rank 0's side: orders to the followers (ranks 1..K-1), their shards gathered into the whole vector."""

    def __init__(self, link: LeaderLink, shards: list[slice]):
        self.link, self.shards = link, shards

    def start(self, w: np.ndarray, resume: Checkpoint | None) -> None:
        """Hand every follower its shard of the initial parameters, and of the checkpoint resumed
        from (its parameters, optimizer state and, for pbs, the table's gradients)."""
        for k in self.link.followers:
            shard = self.shards[k]
            part = None if resume is None else dataclasses.replace(
                resume, params=resume.params[shard].copy(), optimizer=slice_state(resume.optimizer, shard, len(w)),
                table_grads=None if resume.table_grads is None else resume.table_grads[:, shard].copy())
            self.link.send_start(k, (w[shard].copy(), part))

    def commit(self, step: int, lr: float) -> None:
        """Step `step` is done on rank 0, with learning rate `lr`: the followers may apply it."""
        self.link.order(COMMIT, step, value=float_bits(lr))

    def arrival(self, worker: int, step: int, offered: bool) -> None:
        """pbs: rank 0 took `worker`'s next message (of step `step`) and offered it to its table or
        (not `offered`) refused it before."""
        self.link.order(ARRIVAL, step, worker, int(offered))

    def answer(self, worker: int, step: int) -> None:
        """pbs: rank 0 sent `worker` the model of step `step`."""
        self.link.order(ANSWER, step, worker)

    def decode(self, step: int, probe: int | None) -> None:
        """pbs: step `step` decodes now; `probe`: the old model's version when the step probes."""
        self.link.order(DECODE, step, value=-1 if probe is None else probe)

    def diagnosis(self, sums: np.ndarray, now: np.ndarray, old: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """pbs: a step's diagnostics over the whole vector, after decode(). `sums` are rank 0's
        partial sums (TableDiagnostics.sums), `now` and `old` its shards of the probed models
        (`old` None: no probe). Returns the sums over every shard, and at a probe the two whole models."""
        followers = len(self.link.followers)
        theirs = np.zeros((followers, len(sums)))
        nows = olds = None
        whole_now = whole_old = None
        if old is not None:
            whole_now, whole_old = np.empty(self.shards[-1].stop, now.dtype), np.empty(self.shards[-1].stop, old.dtype)
            whole_now[self.shards[0]], whole_old[self.shards[0]] = now, old
            nows = [whole_now[self.shards[k]] for k in self.link.followers]
            olds = [whole_old[self.shards[k]] for k in self.link.followers]
        self.link.receive_diagnoses(theirs, nows, olds)
        if (theirs[:, -1] != sums[-1]).any():  # every server has the same table: the same entries count
            raise PgcError(f"pbs servers disagree on the entries of the table (rank 0: {int(sums[-1])}, the others: "
                           f"{theirs[:, -1].astype(int).tolist()}): their tables differ")
        total = sums + theirs.sum(axis=0)
        total[-1] = sums[-1]
        return total, whole_now, whole_old

    def gather(self, w: np.ndarray, steps: int, state: dict[str, Any] | None = None,
               table: np.ndarray | None = None) -> dict[str, Any] | None:
        """Fill the followers' shards of `w` as they are after `steps` steps; with `state` (rank 0's
        own optimizer state_dict), return the whole vector's; with `table` (pbs: the whole table's
        gradients, n x dim, with state only), fill the followers' columns of it too."""
        self.link.order(GATHER_STATE if state is not None else GATHER, steps)
        self.link.receive_shards([w[self.shards[k]] for k in self.link.followers])
        if state is None:
            return None
        merged = merge_states([state, *self.link.receive_states()])
        if table is not None:
            parts = [np.empty((len(table), self.shards[k].stop - self.shards[k].start), table.dtype)
                     for k in self.link.followers]
            self.link.receive_shards(parts, tag=TAG_TABLE)
            for k, part in zip(self.link.followers, parts, strict=True):
                table[:, self.shards[k]] = part
        return merged

    def end(self, steps: int, grace: float) -> list[dict[str, Any]]:
        """The run ended after `steps` steps: tell the followers, and return their reports (what each
        received), waiting at most `grace` seconds for them."""
        self.link.order(END, steps)
        reports = self.link.receive_reports(time.monotonic() + grace)
        return [report or {"server": k, "report": f"none within --grace {grace:g} s"}
                for k, report in zip(self.link.followers, reports, strict=True)]


class FollowerControl:
    """A follower's RunControl (the interface pgc_mpi.runtime.master.Master reads): rank 0 decides, this obeys.

    It never evaluates or checkpoints; it applies step t only once rank 0 committed it, answers
    rank 0's gathers once it has applied as many steps as asked, and ends the loop at END. With
    `follows_arrivals` (pbs) it also queues rank 0's ARRIVAL, ANSWER and DECODE orders, which the
    step loop carries out one by one (next_event), and its gathers among them: a checkpoint rank 0
    takes in the middle of a step (a signal) then holds, here as there, that step's arrivals so far."""

    eval_seconds = 0.0
    stopped_by = None

    def __init__(self, link: FollowerLink, follows_arrivals: bool = False):
        self.link, self.follows_arrivals = link, follows_arrivals
        self.committed = -1  # the newest step rank 0 committed
        self.applied = 0  # steps applied here
        self.ended: int | None = None  # the run's steps, once rank 0 said END
        self._gathers: list[tuple[int, bool]] = []  # (steps, with state) asked for and not yet answered
        self._lrs: dict[int, float] = {}  # the learning rate rank 0 committed each step with
        self._events: deque[tuple[int, int, int, int]] = deque()  # pbs: orders to carry out in sequence
        self._params: np.ndarray | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._table: np.ndarray | None = None

    def attach(self, params: np.ndarray, optimizer: torch.optim.Optimizer, applied: int,
               table: np.ndarray | None = None) -> None:
        """What gathers send: the shard's parameters and optimizer, which have applied `applied`
        steps (and pbs's table gradients, which checkpoints hold)."""
        self._params, self._optimizer, self.applied, self._table = params, optimizer, applied, table
        self.committed = applied - 1

    def _pump(self) -> None:
        """Read every order that has arrived, and answer the gathers that can be answered now."""
        for order in self.link.orders():
            kind, steps, _, value = order
            if kind == COMMIT:
                self.committed = steps
                self._lrs[steps] = bits_float(value)
            elif kind in (GATHER, GATHER_STATE) and not self.follows_arrivals:
                self._gathers.append((steps, kind == GATHER_STATE))
            elif kind == END:
                self.ended = steps
            elif kind in EVENTS or kind in (GATHER, GATHER_STATE):  # pbs: a gather in its place among
                self._events.append(order)  # the events, so that the table sent holds the arrivals before it
        while self._gathers and self._gathers[0][0] == self.applied:
            _, with_state = self._gathers.pop(0)
            self.link.send_shard(self._params, self._optimizer.state_dict() if with_state else None,
                                 self._table if with_state else None)

    def stop_signal(self, step: int) -> bool:
        """Whether rank 0 ended the run before step `step` (which is then abandoned)."""
        self._pump()
        return self.ended is not None and step >= self.ended

    def next_event(self, step: int) -> tuple[int, int, int, int] | None:
        """pbs: rank 0's next ARRIVAL, ANSWER or DECODE order, as (kind, steps, worker, value),
        waiting for it; None once rank 0 ended the run before step `step`."""
        backoff = Backoff(self.link.poll_interval)
        while not self.stop_signal(step):
            if (order := self._next_event()) is not None:
                return order
            backoff.sleep()
        return None

    def _next_event(self) -> tuple[int, int, int, int] | None:
        """pbs: the first queued order that is not a gather, the gathers queued before it answered
        in their place (None: none queued)."""
        while self._events:
            order = self._events.popleft()
            if order[0] not in (GATHER, GATHER_STATE):
                return order
            self._gathers.append((order[1], order[0] == GATHER_STATE))
            self._pump()  # answers it
        return None

    def may_update(self, step: int, lr: float) -> bool:
        """Wait until rank 0 committed step `step` (True: the optimizer then takes rank 0's learning
        rate for it, whatever `lr` this shard had) or ended the run before it (False)."""
        backoff = Backoff(self.link.poll_interval)
        while not self.stop_signal(step):
            if self.committed >= step:
                lr = self._lrs.pop(step, lr)
                for group in self._optimizer.param_groups:
                    group["lr"] = lr
                return True
            backoff.sleep()
        return False

    def report(self, sums: np.ndarray, now: np.ndarray | None, old: np.ndarray | None) -> None:
        """pbs: this shard's part of a step's diagnostics, for rank 0 (Leader.diagnosis)."""
        self.link.send_diagnosis(sums, now, old)

    def checkpoint_due(self, done: int) -> bool:
        """Never: rank 0 checkpoints the whole vector (gathering this shard)."""
        return False

    def checkpoint_at_end(self) -> bool:
        """Never (see checkpoint_due)."""
        return False

    def after_step(self, step: int, train_loss: float, record: dict | None = None) -> bool:
        """Step `step` is applied here: answer the gathers waiting for it; True once rank 0 ended the run."""
        self.applied = step + 1
        return self.stop_signal(step + 1)

    def wait_for_end(self) -> None:
        """Serve rank 0's gathers until it ends the run (after this shard's loop stopped on its own)."""
        backoff = Backoff(self.link.poll_interval)
        while self.ended is None:
            self._pump()
            while self._next_event() is not None:  # pbs: only gathers can follow the last step
                pass
            backoff.sleep()


def server_report(server: int, totals, bytes_received: int) -> dict[str, Any]:
    """What one server received and did (a pgc_mpi.core.totals.RunTotals): an entry of the summary's `servers`."""
    return {"server": server, "steps": totals.steps, "bytes_received": bytes_received,
            "stragglers_skipped": totals.skipped, "late_messages": totals.late, "rejected_stale": totals.rejected,
            "deadline_missed": totals.deadline_missed}
