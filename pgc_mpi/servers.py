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
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ConfigError
from .transport import Backoff, FollowerLink, LeaderLink

if TYPE_CHECKING:  # a worker imports this module for shard_bounds: it must not load torch (light ranks)
    import torch

    from .checkpoint import Checkpoint

# rank 0's orders to the other servers (transport.LeaderLink.order)
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
        """Hand every follower its shard of the initial parameters, and of the checkpoint resumed from."""
        for k in self.link.followers:
            shard = self.shards[k]
            part = None if resume is None else dataclasses.replace(
                resume, params=resume.params[shard].copy(), optimizer=slice_state(resume.optimizer, shard, len(w)))
            self.link.send_start(k, (w[shard].copy(), part))

    def commit(self, step: int) -> None:
        """Step `step` is done on rank 0: the followers may apply it."""
        self.link.order(COMMIT, step)

    def gather(self, w: np.ndarray, steps: int, state: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Fill the followers' shards of `w` as they are after `steps` steps; with `state` (rank 0's
        own optimizer state_dict), return the whole vector's."""
        self.link.order(GATHER_STATE if state is not None else GATHER, steps)
        self.link.receive_shards([w[self.shards[k]] for k in self.link.followers])
        return None if state is None else merge_states([state, *self.link.receive_states()])

    def end(self, steps: int, grace: float) -> list[dict[str, Any]]:
        """The run ended after `steps` steps: tell the followers, and return their reports (what each
        received), waiting at most `grace` seconds for them."""
        self.link.order(END, steps)
        reports = self.link.receive_reports(time.monotonic() + grace)
        return [report or {"server": k, "report": f"none within --grace {grace:g} s"}
                for k, report in zip(self.link.followers, reports, strict=True)]


class FollowerControl:
    """A follower's RunControl (the interface pgc_mpi.master.Master reads): rank 0 decides, this obeys.

    It never evaluates or checkpoints; it applies step t only once rank 0 committed it, answers
    rank 0's gathers once it has applied as many steps as asked, and ends the loop at END."""

    eval_seconds = 0.0
    stopped_by = None

    def __init__(self, link: FollowerLink):
        self.link = link
        self.committed = -1  # the newest step rank 0 committed
        self.applied = 0  # steps applied here
        self.ended: int | None = None  # the run's steps, once rank 0 said END
        self._gathers: list[tuple[int, bool]] = []  # (steps, with state) asked for and not yet answered
        self._params: np.ndarray | None = None
        self._optimizer: torch.optim.Optimizer | None = None

    def attach(self, params: np.ndarray, optimizer: torch.optim.Optimizer, applied: int) -> None:
        """What gathers send: the shard's parameters and optimizer, which have applied `applied` steps."""
        self._params, self._optimizer, self.applied = params, optimizer, applied
        self.committed = applied - 1

    def _pump(self) -> None:
        """Read every order that has arrived, and answer the gathers that can be answered now."""
        for kind, steps in self.link.orders():
            if kind == COMMIT:
                self.committed = steps
            elif kind in (GATHER, GATHER_STATE):
                self._gathers.append((steps, kind == GATHER_STATE))
            elif kind == END:
                self.ended = steps
        while self._gathers and self._gathers[0][0] == self.applied:
            _, with_state = self._gathers.pop(0)
            self.link.send_shard(self._params, self._optimizer.state_dict() if with_state else None)

    def stop_signal(self, step: int) -> bool:
        """Whether rank 0 ended the run before step `step` (which is then abandoned)."""
        self._pump()
        return self.ended is not None and step >= self.ended

    def may_update(self, step: int) -> bool:
        """Wait until rank 0 committed step `step` (True) or ended the run before it (False)."""
        backoff = Backoff(self.link.poll_interval)
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
        backoff = Backoff(self.link.poll_interval)
        while self.ended is None:
            self._pump()
            backoff.sleep()


def server_report(server: int, totals, bytes_received: int) -> dict[str, Any]:
    """What one server received and did (a pgc_mpi.master.RunTotals): an entry of the summary's `servers`."""
    return {"server": server, "steps": totals.steps, "bytes_received": bytes_received,
            "stragglers_skipped": totals.skipped, "late_messages": totals.late, "rejected_stale": totals.rejected,
            "deadline_missed": totals.deadline_missed}
