"""Rank 0: send models, feed arrivals to the scheme's collector until it can decode, update, repeat.

One loop for every scheme: the collector (pgc_mpi.core.collector) holds the scheme's rules, the
transport moves the bytes, and RunControl (pgc_mpi.runtime.control) decides when to evaluate,
checkpoint and stop. The master applies the runtime's own rules: at most one model in flight
per worker, always the newest; a message that is malformed, non-finite or names another worker
never reaches the collector; the deadline policy when the decode condition is late.

With --servers K and pbs the followers do not collect on their own: rank 0 orders them through
every arrival, answer and decode in its own order (`_follow`; pgc_mpi.runtime.servers says why).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.collector import Decoded, make_collector
from ..core.message import Message
from ..core.schemes import CodedScheme, PbsScheme
from ..core.totals import RunTotals
from ..core.traits import traits
from ..core.wire import DECODE_ERROR_WARNING
from ..errors import Diverged, NotDecodable, PgcError
from ..learning.diagnostics import TableDiagnostics
from ..learning.optim import FlatOptimizer, Recipe
from ..learning.problems import Problem
from ..runs.checkpoint import Checkpoint, Checkpointer
from ..runs.metrics import MASTER_PARTS, MetricsWriter, Progress, RepeatedWarnings, master_times
from .abandon import DecidedNotices
from .control import DISPATCH_INTERVAL, WAIT_REMINDER, RunControl
from .drop_threshold import threshold_chooser
from .following import PbsFollowing
from .lost import LostWorkers
from .servers import FollowerControl, Leader, slice_state
from .transport import MasterTransport

log = logging.getLogger("pgc_mpi")



@dataclass(frozen=True)
class MasterSettings:
    """The settings the step loop itself reads (a subset of the run's configuration)."""

    steps: int
    optimizer: str = "sgd"
    lr: float = 0.5
    momentum: float = 0.9
    deadline: float | None = None
    on_deadline: str = "wait"
    max_staleness: int | None = None
    record_params: bool = False
    probe_every: int = 20  # pbs diagnostics: steps between two probes (two validation gradients)
    adapt: bool = False
    lost_after: float | None = None  # seconds of silence before a worker is declared lost (runtime.lost)
    recipe: Recipe | None = None  # the update (pgc_mpi.learning.optim); None: `optimizer`, `lr`, `momentum`
    abandon_late: bool = False  # tell workers on a decided step (pgc_mpi.runtime.abandon)
    drop_compute: float | str | None = None  # --drop-compute (auto: rank 0 chooses, runtime.drop_threshold)
    micro_batches: int = 1  # --accumulate

    def update_recipe(self) -> Recipe:
        """The recipe of the update: `recipe`, or the built-in `optimizer` at a constant `lr`."""
        return self.recipe or Recipe(optimizer=self.optimizer, lr=self.lr, momentum=self.momentum, steps=self.steps)


class Master(PbsFollowing):
    """The parameter server loop for one run, coded schemes and pbs alike."""

    def __init__(self, settings: MasterSettings, scheme: CodedScheme | PbsScheme, params: np.ndarray,
                 link: MasterTransport, metrics: MetricsWriter | None = None, progress: Progress | None = None,
                 checkpointer: Checkpointer | None = None, resume: Checkpoint | None = None,
                 problem: Problem | None = None, own: slice = slice(None), servers: Leader | None = None,
                 optimizer: FlatOptimizer | None = None):
        """`params`: the initial parameters, the whole vector on rank 0 and a follower's shard on
        the other servers (--servers K, pgc_mpi.runtime.servers); this server updates `params[own]` and
        rank 0 gathers the rest from `servers` when it needs the whole vector. A follower writes no
        metrics, progress or checkpoints (None). `problem` serves pbs's diagnostics only (rank 0's).
        With pbs and `servers`, rank 0 orders the followers through its arrivals, answers and
        decodes (pgc_mpi.runtime.servers). `optimizer`: the update, built already over `params[own]`
        (rank 0 builds it before training, so that a user's factory that fails is a one-line
        error); None: the settings' recipe, built here."""
        self.settings, self.scheme, self.problem, self.link = settings, scheme, problem, link
        self.metrics, self.progress, self.checkpointer = metrics, progress, checkpointer
        self.n = scheme.n
        self.own, self.servers = own, servers
        if optimizer is not None:
            if not np.shares_memory(optimizer.w, params) or params.dtype != link.wire.compute:
                raise PgcError("the master's optimizer must be built over its parameters, in the run's dtype")
            self.w, self.opt = params, optimizer
        else:
            self.w = params.astype(link.wire.compute)
            self.opt = FlatOptimizer(self.w[own], settings.update_recipe())
        self._update_record: dict = {}  # the last update's lr and grad_norm, for its step record
        self.collector = make_collector(scheme, self.opt.grad, settings.max_staleness,
                                        first=resume.step if resume is not None else 0)
        # pbs with --servers K: rank 0 names every arrival, answer and decode to the followers
        self.leads_arrivals = servers is not None and isinstance(scheme, PbsScheme)
        self.diagnostics = (TableDiagnostics(problem, settings.probe_every, settings.max_staleness, settings.adapt,
                                             peers=servers if self.leads_arrivals else None)
                            if isinstance(scheme, PbsScheme) else None)
        self.control: RunControl | FollowerControl | None = None  # set by run()
        self.follows_arrivals = False  # set by run(): a pbs follower, which repeats rank 0's arrivals
        self._unnamed: set[int] = set()  # a pbs follower's arrived messages that rank 0 has not named yet
        self.totals = RunTotals()
        self.sent = [-1] * self.n  # newest model version sent to each worker
        self.busy = [False] * self.n  # a model is out with the worker and its answer is not back
        self.sent_at = [(-1, math.nan)] * self.n  # (step, time) of the last model sent: turnarounds start there
        self.gone = LostWorkers(self.n, settings.lost_after, scheme.placement, link.first_worker)
        if settings.abandon_late:  # the transport's polls take the workers' answers (link.abandoned)
            link.notices = DecidedNotices(link.comm, self.n, link.first_worker)
        # --drop-compute auto: rank 0 chooses the threshold from its step records and tells the workers
        self.chooser = (threshold_chooser(settings.drop_compute, scheme.name, settings.micro_batches, link.comm,
                                          range(link.first_worker, link.first_worker + self.n))
                        if metrics is not None else None)
        self._started = time.monotonic()
        # the master's own work in the current step, in seconds per part (see _timed)
        self._times = dict.fromkeys(MASTER_PARTS, 0.0)
        self._warnings = RepeatedWarnings(log)
        self._rejected: dict[int, str] = {}  # this step's rejected workers and why (kind)
        self.start = 0
        if resume is not None:
            self._restore(resume)
        self.trajectory: list[np.ndarray] = [self.w.copy()] if settings.record_params else []

    def _restore(self, resume: Checkpoint) -> None:
        """Continue from a checkpoint: its parameters, RNG, pbs table and the optimizer's state
        (FlatOptimizer.restore says which learning rate applies)."""
        np.copyto(self.w, resume.params)
        flat = slice_state(resume.optimizer, self.own, len(self.w)) if self.opt.flat else None
        what = self.opt.restore(flat, resume.blobs, str(resume.path))
        torch.set_rng_state(resume.rng)
        table = resume.table_grads is not None
        if table:  # rank 0's checkpoint holds the whole table (a follower is handed its columns)
            self.collector.table.grads[...] = resume.table_grads[:, self.own]
            self.collector.table.versions[...] = resume.table_versions
        self.start = self.totals.steps = resume.step
        log.info("resumed from %s at step %d: parameters, RNG%s and %s", resume.path, resume.step,
                 ", pbs table" if table else "", what)

    def run(self, control: RunControl | FollowerControl) -> RunTotals:
        """Train until the last step, the target loss or a stop signal (as `control` decides)."""
        self.control = control
        self.follows_arrivals = getattr(control, "follows_arrivals", False)
        for i in range(self.n):
            self.link.post(i)
        if self.settings.lost_after is not None:
            self.link.listen_for_heartbeats()
        for t in range(self.start, self.settings.steps):
            began = time.monotonic()
            try:
                dec, missed = self._follow(t) if self.follows_arrivals else self._collect(t, began)
                if dec is None:  # a stop (or workers lost): the step in progress is abandoned
                    break
                # before the commit: --adapt may change the learning rate the step is applied with
                extra = self._timed("update", functools.partial(self._diagnose, t))
                if not control.may_update(t, self.opt.opt.param_groups[0]["lr"]):
                    break
                self._timed("update", functools.partial(self._update, t))
            except Diverged as exc:  # no checkpoint of non-finite numbers: the last finite one stays
                log.error("%s", exc)
                self.totals.diverged = str(exc)
                break
            if self._finish_step(t, began, dec, missed, extra):
                break
        self._warnings.flush()
        if self.totals.diverged is None and (control.checkpoint_at_end() or self.totals.lost):
            self.checkpoint()
        return self.totals

    def _diagnose(self, t: int) -> dict:
        """pbs's error decomposition of the decoded step (pgc_mpi.learning.diagnostics); nothing for the
        others, nor on a follower (its part went to rank 0 in _follow)."""
        if self.diagnostics is None or self.follows_arrivals:
            return {}
        return self.diagnostics.observe(t, self.collector.table, self.opt.grad, self.opt)

    def _update(self, t: int) -> None:
        """The optimizer step; parameters that are no longer finite end the run."""
        # with --servers K a shard's norm is not the gradient's (the global one is not reduced): none
        self._update_record = self.opt.step(measure=self.servers is None and self.metrics is not None)
        if not np.isfinite(self.w[self.own].sum()):
            raise Diverged(f"training diverged at step {t}: the parameters became NaN or Inf after the update "
                           f"(lower --lr, or check the data for NaN/Inf)")

    def checkpoint(self, name: str | None = None) -> Path:
        """Write a checkpoint of the state after the steps done so far (the whole vector's, with
        --servers), under the step's name or `name` (e.g. best: --keep-best); returns its path."""
        table = getattr(self.collector, "table", None)
        encoding = self.scheme.encoding_matrix() if table is None else None
        state = self.opt.opt.state_dict()
        if not self.opt.flat:  # a user's optimizer: its whole state goes in a blob (state_blobs)
            state = {"state": {}, "param_groups": state["param_groups"]}
        if self.servers is not None:
            if table is not None:  # pbs: the whole table, the followers' columns gathered
                whole = self.scheme.new_table(len(self.w), table.grads.dtype)
                whole.grads[:, self.own], whole.versions[...] = table.grads, table.versions
                table = whole
            state = self.servers.gather(self.w, self.totals.steps, state, None if table is None else table.grads)
        blobs = {**self.opt.state_blobs(), **self.control.state_blobs()}
        path = self.checkpointer.save(self.totals.steps, self.w, state, encoding=encoding, table=table, blobs=blobs,
                                      model_state=self._model_state(), name=name)
        log.info("checkpoint %s", path)
        self.control.checkpointed(path)
        return path

    def _model_state(self):
        """The model's layout and buffers (batch-norm statistics as an evaluation computes them), for
        pgc-export; None for a synthetic problem."""
        if not hasattr(self.problem, "state_layout"):
            return None
        return self.problem.state_layout(), self.problem.model_state(self.w)

    def full_params(self) -> np.ndarray:
        """The whole parameter vector after the steps done so far (the shards gathered, with --servers)."""
        if self.servers is not None:
            self.servers.gather(self.w, self.totals.steps)
        return self.w

    def _collect(self, t: int, began: float) -> tuple[Decoded | None, bool]:
        """Receive until the step decodes or the deadline policy ends it: (decoded, deadline missed);
        decoded is None when a stop signal arrived."""
        collector, deadline = self.collector, self.settings.deadline
        collector.begin(t)
        self._begin(t)
        deadline_at = began + deadline if deadline is not None else math.inf
        reminder, missed = began + WAIT_REMINDER, False
        while True:
            self._timed("send", lambda: self._dispatch(t))
            if self.control.stop_signal(t):
                return None, missed
            until = min(math.inf if missed else deadline_at, reminder, time.monotonic() + DISPATCH_INTERVAL)
            arrived = self.link.poll(until)
            self._count_malformed(t)
            self._free_abandoned()
            for i in arrived:
                self._timed("receive", functools.partial(self._receive, t, i))
            self._check_rejections(t)
            self.gone.declare(t, self.link.heard, self.metrics.write if self.metrics is not None else None)
            if not collector.ready() and self.gone.stuck(collector.waiting_for(), collector.waits_on):
                self.totals.lost = sorted(self.gone.lost)
                log.error("step %d cannot complete: it needs lost workers %s (%s tolerates %d); ending the run with "
                          "a checkpoint: resume it on the workers that are left", t, self.totals.lost,
                          self.scheme.name, 0 if traits(self.scheme.name).waits_for_all else self.scheme.s)
                return None, missed
            if collector.ready():
                try:
                    return self._timed("decode", collector.decode), missed
                except NotDecodable as exc:  # e.g. an ill-conditioned exact solve: wait for more
                    log.warning("step %d: %s", t, exc)
            now = time.monotonic()
            if not missed and now >= deadline_at:
                missed = True
                log.warning("step %d: deadline of %.3g s missed, still waiting for %s (policy %s)",
                            t, deadline, self._waiting(), self.settings.on_deadline)
                dec = self._timed("decode", lambda: collector.on_deadline(self.settings.on_deadline))
                if dec is not None:
                    log.warning("step %d: partial decode from workers %s, residual %.3g", t, dec.used, dec.residual)
                    return dec, missed
            elif now >= reminder:
                log.warning("step %d: waited %.0f s so far; still waiting for %s", t, now - began, self._waiting())
                reminder = now + WAIT_REMINDER

    def _begin(self, t: int) -> None:
        """What every step starts with: the model of step t remembered and published."""
        if self.diagnostics is not None:
            self.diagnostics.remember(t, self.w[self.own])
        self._times = dict.fromkeys(MASTER_PARTS, 0.0)
        self._rejected = {}
        self._timed("send", lambda: self.link.publish(t, self.w[self.own]))
        self._abandoned = 0
        if self.link.notices is not None and t > self.start:  # step t - 1 is decided
            self._timed("send", lambda: self.link.notices.tell(t - 1, self.sent, self.busy))

    def _waiting(self) -> str:
        return f"{self.collector.waits_on} {self.collector.waiting_for()}"

    def _timed(self, part: str, work):
        """Run `work()`, adding its time to the step's `part` (one of MASTER_PARTS)."""
        began = time.monotonic()
        try:
            return work()
        finally:
            self._times[part] += time.monotonic() - began

    def _dispatch(self, t: int) -> None:
        """Send the model of step t to every worker that needs it: one that has not had it (or, for
        pbs, whose message it answers), whose previous model has been delivered and whose answer
        to it is back."""
        for i in range(self.n):
            if self.sent[i] < t and not self.busy[i] and not self.link.model_in_flight(i):
                self.sent_at[i] = (t, time.monotonic())
                self.link.send_model(i)
                self.sent[i], self.busy[i] = t, True
                if self.leads_arrivals:
                    self.servers.answer(i, t)

    def _receive(self, t: int, worker: int) -> None:
        """Judge one arrived message, offer it to the collector, and free its buffer unless held."""
        arrived, self.busy[worker] = time.monotonic(), False
        msg = Message.read(self.link.headers[worker])
        step, sent = self.sent_at[worker]  # the model it answers: one is in flight per worker, the newest
        msg.turnaround = arrived - sent if msg.step == step else math.nan  # else a fault: which send is unknown
        values = self.link.gradient(worker)  # widened to the run's dtype
        kind, why = self._fault(worker, msg, values)
        if self.leads_arrivals:
            self.servers.arrival(worker, msg.step, offered=kind is None)
        if kind is None:
            verdict = self.collector.offer(msg, values)
            if verdict in ("future", "unknown", "duplicate"):
                kind, why = verdict, (f"a {verdict} message (header says worker {msg.worker}, step {msg.step}, "
                                      f"partition {msg.partition})")
        if worker not in self.collector.held:
            self.link.post(worker)
        if kind is not None:
            self._reject(t, worker, kind, why)
        elif self.collector.answers_every_message:  # pbs: answered with the current model at once
            self.sent[worker] = -1

    def _fault(self, worker: int, msg: Message, values: np.ndarray) -> tuple[str | None, str]:
        """(kind, why) a received message must not enter the model, or (None, ""): a NaN or Inf never does."""
        if msg.worker != worker:
            return "misaddressed", f"its header names worker {msg.worker}"
        if not np.isfinite(values.sum()):
            return "non-finite", "the gradient contains NaN or Inf"
        if not np.isfinite(msg.loss):
            return "non-finite", "its minibatch loss is NaN or Inf"
        return None, ""

    def _count_malformed(self, t: int) -> None:
        """Messages the transport refused (wrong size): counted and logged; the worker is free again."""
        bad, self.link.malformed[:] = list(self.link.malformed), []
        for worker, why in bad:
            self.busy[worker] = False
            if self.leads_arrivals:
                self.servers.arrival(worker, -1, offered=False)
            self._reject(t, worker, "malformed", why)

    def _free_abandoned(self) -> None:
        """Workers that dropped a decided job (--abandon-late) are free: the next dispatch sends them the model."""
        for worker, step in self.link.abandoned:
            if self.busy[worker] and self.sent[worker] == step:
                self.busy[worker] = False
                self._abandoned += 1
        self.link.abandoned.clear()

    def _reject(self, t: int, worker: int, kind: str, why: str) -> None:
        """Count and log a message that must not enter the model. Its worker counts as a straggler
        and gets the current model again, once per step (a transient fault then costs one
        recomputation, and a worker whose data always gives NaN does not spin)."""
        self.totals.rejected_messages += 1
        self.collector.note_rejected(worker)
        if worker not in self._rejected:
            self.sent[worker] = -1
        self._warnings.warn((worker, kind), f"step {t}: rejected a message from worker {worker} "
                                            f"(rank {worker + self.link.first_worker}): {why}")
        if worker not in self._rejected and len(self._rejected) == self.scheme.s:
            then = ("without --deadline it completes only if their one retry at the current model succeeds"
                    if self.settings.deadline is None else f"unless their retries succeed, --on-deadline "
                    f"{self.settings.on_deadline} applies at the deadline")
            log.warning("step %d: messages of %d workers %s were rejected, more than s = %d: %s",
                        t, self.scheme.s + 1, sorted([*self._rejected, worker]), self.scheme.s, then)
        if kind == "non-finite" or worker not in self._rejected:
            self._rejected[worker] = kind

    def _check_rejections(self, t: int) -> None:
        """Training has diverged when every worker has sent non-finite numbers in this step."""
        if sum(kind == "non-finite" for kind in self._rejected.values()) == self.n:
            raise Diverged(f"training diverged at step {t}: every worker's gradient or loss is NaN or Inf "
                           f"(lower --lr, or check the data and the checkpoint for NaN/Inf)")

    def _wire_error(self, t: int, dec: Decoded) -> float:
        """The decoded gradient's estimated rounding error from a narrow --wire-dtype, said when large."""
        wire = self.link.wire
        error = wire.decode_error(dec.weights)
        if error > DECODE_ERROR_WARNING:
            largest = float(np.abs(dec.weights).max()) if dec.weights is not None else 1 / self.n
            self._warnings.warn(("wire",), f"step {t}: {self.scheme.name}'s decode weights (largest |a_i| = "
                                           f"{largest:.3g}) amplify {wire.name}'s rounding to about {error:.2g} of "
                                           f"the gradient's size: use --wire-dtype float32 with this scheme")
        return error

    def _finish_step(self, t: int, began: float, dec: Decoded, missed: bool, extra: dict) -> bool:
        """Release held buffers, log the step, checkpoint when due; returns True to stop."""
        for i in self.collector.held:
            self.link.post(i)
        record = {**self.collector.record(dec, missed), **extra, **self._update_record,
                  "wire_error": self._wire_error(t, dec),
                  **({"abandoned": self._abandoned} if self.link.notices is not None else {})}
        step_time = time.monotonic() - began
        totals = self.totals
        totals.steps = t + 1
        totals.skipped += self.n - len(set(dec.used))
        totals.late += record["late"]
        totals.abandoned += record.get("abandoned", 0)
        totals.rejected += len(record["rejected"])
        totals.deadline_missed += int(missed)
        record = {"step": t, "wall_time": time.monotonic() - self._started - self.control.eval_seconds,
                  "step_time": step_time, **master_times(self._times), "bytes_received": self.link.bytes_received,
                  **record}
        if self.chooser is not None:
            self.chooser.observe(record)
        if self.metrics is not None:
            self.metrics.write(record)
        # The step's record before the checkpoint that counts it done: a kill between the two then
        # leaves a record the resume cuts (it keeps the checkpoint's steps), never a step without one.
        if self.control.checkpoint_due(t + 1):
            self.checkpoint()
        if self.settings.record_params:
            self.trajectory.append(self.full_params().copy())
        if self.progress is not None:
            self.progress.update(t, record["train_loss"], step_time, totals.skipped)
        return self.control.after_step(t, record["train_loss"], record)
