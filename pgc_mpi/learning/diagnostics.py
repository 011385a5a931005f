"""pbs's error decomposition: how far the table's stale mean is from the current gradient.

The table steps with g_hat = (1/n) sum_i g_i(w_{v_i}), gradients computed at older models. If
the loss is L-smooth, ||g_hat - grad F(w_t)||^2 <= L^2 * (1/n) sum_i ||w_t - w_{v_i}||^2 (up to
minibatch noise), so the staleness error is small when L^2 times the mean squared parameter
displacement is small next to ||g_hat||^2. Per step (cheap) this logs

- `grad_norm_sq`: ||g_hat||^2;
- `displacement`: (1/n) sum_i ||w_t - w_{v_i}||^2 over the table's entries (`displaced_entries`
  says over how many: entries whose model is no longer kept, after a resume or beyond an unbounded
  --max-staleness, are left out);

and every `probe_every` steps (two gradients on one fixed validation minibatch, `probe_grad`):

- `smoothness`: L_hat = ||g(w_t) - g(w_old)|| / ||w_t - w_old||, w_old the oldest entry's model;
- `stale_cosine`: the cosine between g(w_old) and g(w_t);
- `error_bound`: L_hat^2 * displacement, to read next to grad_norm_sq.

With --adapt the learning rate is halved (never below 1/64 of its start) at a probe where
error_bound exceeds ADAPT_FRACTION * grad_norm_sq: the stale error would then be at least half
the gradient's norm (sqrt(1/4)).

With --servers K (pgc_mpi.runtime.servers) every server remembers its shard of the models and computes
the per-step quantities on its shard (`sums`: ||g_hat||^2 and the squared displacements are
sums over coordinates, so the shards' sums add up to the whole vector's). Rank 0 adds the
followers' sums to its own (`peers`: the servers.Leader), and at a probe, where L_hat and the
cosine need two whole gradients, it receives their shards of w_t and w_old and probes the whole
vectors itself. It alone decides --adapt; its learning rate reaches the followers with the step's
commit, so every shard steps with the same rate.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from ..core.table import PartitionTable
from .optim import FlatOptimizer
from .problems import Problem


class Peers(Protocol):
    """What the diagnostics ask of the other servers (pgc_mpi.runtime.servers.Leader, with --servers K)."""

    def decode(self, step: int, probe: int | None) -> None: ...

    def diagnosis(self, sums: np.ndarray, now: np.ndarray, old: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]: ...


ADAPT_FRACTION = 0.25
ADAPT_FACTOR = 0.5
ADAPT_FLOOR = 1 / 64


class TableDiagnostics:
    """Keeps the models the table's entries were computed at and measures the decomposition."""

    def __init__(self, problem: Problem | None, probe_every: int, horizon: int | None, adapt: bool = False,
                 peers: Peers | None = None):
        """`problem` serves the probes (None on a follower server, which never probes); `peers`: the
        other servers' shards' part (rank 0 of a sharded pbs run)."""
        self.problem, self.probe_every, self.adapt, self.peers = problem, probe_every, adapt, peers
        self.horizon = horizon  # models older than this many steps are never used again (None: unknown)
        self.models: dict[int, np.ndarray] = {}
        self._lr0: float | None = None

    def remember(self, step: int, w: np.ndarray) -> None:
        """Keep w_step (this server's shard of it), the model workers get during `step` (call before the update)."""
        self.models[step] = w.copy()

    def probe_version(self, step: int, table: PartitionTable) -> int | None:
        """The version of the oldest entry whose model is kept, when `step` probes (else None)."""
        versions = self._displaced(table)
        return min(versions) if versions and (step + 1) % self.probe_every == 0 else None

    def sums(self, step: int, table: PartitionTable, grad: np.ndarray) -> np.ndarray:
        """[||g_hat||^2, sum over the displaced entries of ||w_step - w_v||^2, their number] over
        this server's parameters (`grad`: the decoded g_hat)."""
        w = self.models[step]
        versions = self._displaced(table)
        sq = sum(float(np.sum((w - self.models[v]) ** 2)) for v in versions)
        return np.array([float(np.dot(grad, grad)), sq, len(versions)])

    def observe(self, step: int, table: PartitionTable, grad: np.ndarray, opt: FlatOptimizer) -> dict:
        """The step's diagnostics (grad: the decoded g_hat, w_step remembered); applies --adapt.
        With `peers`, over every server's shard (the followers are told to decode first)."""
        probe = self.probe_version(step, table)
        if self.peers is not None:
            self.peers.decode(step, probe)
        sums, w, old = self.sums(step, table, grad), self.models[step], self.models.get(probe)
        if self.peers is not None:
            sums, w, old = self.peers.diagnosis(sums, w, old)
        gsq, sq, count = float(sums[0]), float(sums[1]), int(sums[2])
        out = {"grad_norm_sq": gsq, "displacement": sq / count if count else math.nan, "displaced_entries": count}
        if probe is not None:
            out.update(self._probe(w, old, out["displacement"]))
            if self.adapt and out["error_bound"] > ADAPT_FRACTION * gsq:
                out["lr"] = self._shrink(opt)
        self._forget(step, table)
        return out

    def report(self, step: int, table: PartitionTable, grad: np.ndarray, probe: int | None
               ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """A follower's part of step `step`'s diagnostics, for rank 0's observe: its sums, and with
        `probe` (the old model's version, rank 0's) its shards of w_step and w_probe."""
        out = (self.sums(step, table, grad), *((self.models[step], self.models[probe]) if probe is not None
                                               else (None, None)))
        self._forget(step, table)
        return out

    def _displaced(self, table: PartitionTable) -> list[int]:
        """The entries' versions whose models are kept (every server keeps the same ones)."""
        return [v for v in table.filled_versions() if v in self.models]

    def _probe(self, w: np.ndarray, old: np.ndarray, displacement: float) -> dict:
        g_now = self.problem.probe_grad(w).astype(np.float64)
        g_old = self.problem.probe_grad(old).astype(np.float64)
        moved = float(np.linalg.norm(w.astype(np.float64) - old))
        norms = float(np.linalg.norm(g_now) * np.linalg.norm(g_old))
        smooth = float(np.linalg.norm(g_now - g_old)) / moved if moved > 0 else math.nan
        return {"smoothness": smooth, "stale_cosine": float(g_now @ g_old) / norms if norms > 0 else math.nan,
                "error_bound": smooth ** 2 * displacement if moved > 0 else 0.0}

    def _shrink(self, opt: FlatOptimizer) -> float:
        group = opt.opt.param_groups[0]
        if self._lr0 is None:
            self._lr0 = group["lr"]
        group["lr"] = max(group["lr"] * ADAPT_FACTOR, self._lr0 * ADAPT_FLOOR)
        return float(group["lr"])

    def _forget(self, step: int, table: PartitionTable) -> None:
        """Drop models no entry uses and no future entry can (older than the horizon)."""
        used = set(table.filled_versions())
        oldest = step + 1 - self.horizon if self.horizon is not None else min(used, default=step)
        for v in [v for v in self.models if v < oldest and v not in used]:
            del self.models[v]
