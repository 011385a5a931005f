"""Rank 0: send models, collect the first arrivals until the scheme can decode, update, repeat."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import checkpoint, signals
from .collector import DeadlineMissed, Decoded, StepCollector
from .config import TrainConfig
from .errors import NotDecodable
from .metrics import MetricsWriter, Progress
from .optim import FlatOptimizer
from .problems import Problem
from .schemes import CodedScheme, PbsScheme
from .transport import MasterTransport
from .worker import HEADER_FIELDS

log = logging.getLogger("pgc_mpi")

# While waiting past a missed deadline (policy `wait`), remind the log this often.
WAIT_REMINDER = 30.0


def run_identity(cfg: TrainConfig, scheme: CodedScheme | PbsScheme, dim: int) -> dict:
    """What a checkpoint must match to be resumed by this run."""
    return {"scheme": cfg.scheme, "n": scheme.n, "s": scheme.s, "c": scheme.c, "dim": dim, "dtype": cfg.dtype,
            "model": cfg.model, "dataset": cfg.dataset, "seed": cfg.seed}


@dataclass
class RunTotals:
    """Counters for the final summary."""

    steps: int = 0
    skipped: int = 0  # worker-steps whose message did not enter the update
    late: int = 0
    rejected: int = 0
    deadline_missed: int = 0
    last_eval: dict = field(default_factory=dict)
    stopped_early: bool = False
    stopped_by: str | None = None  # the signal that stopped the run
    rejected_messages: int = 0  # malformed or non-finite: never let into the model


class Master:
    """The parameter server loop for one run, coded schemes and pbs alike."""

    def __init__(self, cfg: TrainConfig, scheme: CodedScheme | PbsScheme, problem: Problem,
                 link: MasterTransport, metrics: MetricsWriter, progress: Progress, out: Path,
                 resume: checkpoint.Checkpoint | None = None):
        self.cfg, self.scheme, self.problem, self.link = cfg, scheme, problem, link
        self.metrics, self.progress = metrics, progress
        self.n = scheme.n
        self.w = problem.initial_params().astype(link.grad_layout.dtype)
        self.opt = FlatOptimizer(self.w, cfg.optimizer, cfg.lr, momentum=cfg.momentum)
        self._scratch = np.empty_like(self.w)
        self.totals = RunTotals()  # (before a resume sets its step count)
        self._recent_losses: list[float] = []
        self._started = time.monotonic()
        self._eval_seconds = 0.0  # evaluations pause training: wall_time leaves them out
        self.out = out
        self.table = scheme.new_table(problem.dim, link.grad_layout.dtype) if isinstance(scheme, PbsScheme) else None
        self.start = 0
        if resume is not None:
            np.copyto(self.w, resume.params)
            self.opt.opt.load_state_dict(resume.optimizer)
            torch.set_rng_state(resume.rng)
            if self.table is not None:
                self.table.grads[...] = resume.table_grads
                self.table.versions[...] = resume.table_versions
            self.start = self.totals.steps = resume.step
            log.info("resumed from %s at step %d", resume.path, resume.step)
        self.trajectory: list[np.ndarray] = [self.w.copy()] if cfg.record_params else []

    def run(self) -> RunTotals:
        """Train for cfg.steps steps (or to the target loss)."""
        for i in range(self.n):
            self.link.post(i)
        if isinstance(self.scheme, PbsScheme):
            self._run_table()
        else:
            self._run_coded()
        if self.cfg.checkpoint_every is not None or self.totals.stopped_by or self._checkpoint_requested():
            self.checkpoint()
        return self.totals

    def _checkpoint_requested(self) -> bool:
        """A checkpoint on demand: the file OUT/CHECKPOINT (removed once seen) or SIGUSR2 to rank 0.

        (mpiexec does not forward SIGUSR2 - it dies of it - so the file works with every launcher.)"""
        trigger = self.out / "CHECKPOINT"
        if trigger.exists():
            trigger.unlink(missing_ok=True)
            return True
        return signals.checkpoint_requested()

    def checkpoint(self) -> Path:
        """Write a checkpoint of the state after the steps done so far."""
        path = checkpoint.save(
            self.out / "checkpoints", self.totals.steps, self.w, self.opt.opt, run_identity(self.cfg, self.scheme,
                                                                                            self.problem.dim),
            self.cfg.to_dict(), encoding=None if self.table is not None else self.scheme.encoding_matrix(),
            table=self.table, keep=self.cfg.keep_checkpoints)
        log.info("checkpoint %s", path)
        return path

    # -- coded schemes -------------------------------------------------------------------------

    def _run_coded(self) -> None:
        collector = StepCollector(self.scheme, self.cfg.max_staleness)
        streams = self.scheme.streams
        busy = [False] * self.n  # a model is out with the worker and its answer is not back
        g = self.opt.grad
        for t in range(self.start, self.cfg.steps):
            began = time.monotonic()
            collector.begin(t)
            self.link.publish(t, self.w)
            for i in range(self.n):
                if not busy[i]:
                    self.link.send_model(i)
                    busy[i] = True
            held: list[int] = []  # accepted buffers kept for a decode after the last arrival
            summed: list[int] = []  # messages already added into g (streaming decoders)
            losses: dict[int, float] = {}
            messages: list[list] = []
            dec, missed = None, False
            g[:] = 0.0
            decode_time = 0.0
            deadline_at = began + self.cfg.deadline if self.cfg.deadline is not None else math.inf
            reminder = began + WAIT_REMINDER
            while dec is None:
                if self._signalled(t):
                    return
                arrived = self.link.poll(min(deadline_at if not missed else math.inf, reminder, time.monotonic() + 1))
                for i in self._rejected(t, messages):
                    busy[i] = False
                for i in arrived:
                    header = self.link.headers[i]
                    busy[i] = False
                    if not self._sound(t, i, messages):
                        self.link.post(i)
                        continue
                    verdict = collector.offer(i, int(header[0]), header[HEADER_FIELDS:].astype(int).tolist())
                    if verdict in ("future", "unknown", "duplicate"):
                        self._reject(t, i, f"a {verdict} message (header says worker {int(header[1])}, "
                                           f"step {int(header[0])})", messages)
                        self.link.post(i)
                        continue
                    messages.append([i, int(header[0]), float(header[5]), float(header[4]), int(header[6]), verdict])
                    if verdict == "accepted":
                        losses[i] = float(header[3])
                        if not streams:
                            held.append(i)
                            continue
                        if collector.last_counted:  # decode while waiting: add it now
                            mark = time.monotonic()
                            g += self.link.payloads[i]
                            summed.append(i)
                            decode_time += time.monotonic() - mark
                    self.link.post(i)
                    if verdict == "late":  # the newest-model rule: it goes straight to this step
                        self.link.send_model(i)
                        busy[i] = True
                if collector.ready():
                    try:
                        dec = collector.decode()
                    except NotDecodable as exc:
                        log.warning("step %d: %s", t, exc)
                    continue
                now = time.monotonic()
                if not missed and now >= deadline_at:
                    missed = True
                    waiting = [i for i in range(self.n) if i not in collector.versions]
                    log.warning("step %d: deadline of %.3g s missed, still waiting for workers %s (policy %s)",
                                t, self.cfg.deadline, waiting, self.cfg.on_deadline)
                    dec = collector.on_deadline(self.cfg.on_deadline)
                    if dec is not None:
                        log.warning("step %d: partial decode from workers %s, residual ||a^T B - 1/n|| = %.3g",
                                    t, dec.used, dec.residual)
                elif now >= reminder:
                    waiting = [i for i in range(self.n) if i not in collector.versions]
                    log.warning("step %d: waited %.0f s so far; workers %s have not answered",
                                t, now - began, waiting)
                    reminder = now + WAIT_REMINDER
            mark = time.monotonic()
            self._finish_decode(dec, summed, held)
            decode_time += time.monotonic() - mark
            for i in held:
                self.link.post(i)
            used = set(dec.used)
            for m in messages:
                m[-1] = "used" if m[-1] == "accepted" and m[0] in used else m[-1]
            record = {
                "arrivals": collector.arrived, "used": dec.used, "late": collector.late,
                "rejected": collector.rejected, "deadline_missed": missed, "partial": dec.partial,
                "residual": dec.residual, "max_staleness": dec.max_staleness, "decode_time": decode_time,
                "versions": collector.versions, "messages": messages,
                "train_loss": float(np.mean([losses[i] for i in dec.used])),
            }
            self.totals.late += collector.late
            self.totals.rejected += len(collector.rejected)
            if self._finish_step(t, began, record):
                break

    def _finish_decode(self, dec: Decoded, summed: list[int], held: list[int]) -> None:
        """g_hat = sum_i a_i m_i into the optimizer's gradient buffer, then the update.

        A streaming decoder has already summed its messages (their weights are one common
        factor): only the scaling is left. Otherwise the held buffers are combined now, with an
        axpy through a preallocated scratch buffer (no per-step allocation).
        """
        g = self.opt.grad
        if summed:
            if summed != dec.used:
                raise RuntimeError(f"streamed {summed} but the decoder used {dec.used}")
            g *= g.dtype.type(dec.weights[summed[0]])
        else:
            for i in dec.used:
                np.multiply(self.link.payloads[i], g.dtype.type(dec.weights[i]), out=self._scratch)
                g += self._scratch
        self.opt.step()

    # -- pbs -----------------------------------------------------------------------------------

    def _run_table(self) -> None:
        table = self.table
        sent = [-1] * self.n  # newest model version sent to each worker
        t = self.start
        while t < self.cfg.steps:
            began = time.monotonic()
            self.link.publish(t, self.w)
            arrivals: list[int] = []
            losses: list[float] = []
            messages: list[list] = []
            missed = False
            deadline_at = began + self.cfg.deadline if self.cfg.deadline is not None else math.inf
            while True:
                if self._signalled(t):
                    return
                for i in range(self.n):  # at most one model in flight per worker, always the newest
                    if sent[i] < t and not self.link.model_in_flight(i):
                        self.link.send_model(i)
                        sent[i] = t
                arrived = self.link.poll(min(time.monotonic() + 0.05, deadline_at if not missed else math.inf))
                self._rejected(t, messages)
                for i in arrived:
                    header = self.link.headers[i]
                    if not self._sound(t, i, messages) or not 0 <= int(header[2]) < self.n:
                        self.link.post(i)
                        continue
                    fresh = table.offer(int(header[2]), int(header[0]), self.link.payloads[i])
                    messages.append([i, int(header[0]), float(header[5]), float(header[4]), 1,
                                     "used" if fresh else "stale"])
                    losses.append(float(header[3]))
                    arrivals.append(i)
                    self.link.post(i)
                if table.ready(t) and arrivals:
                    break
                if not missed and time.monotonic() >= deadline_at:
                    missed = True
                    log.warning("step %d: deadline missed, partitions %s have no fresh gradient (policy %s)",
                                t, table.missing(t), self.cfg.on_deadline)
                    if self.cfg.on_deadline == "fail":
                        raise DeadlineMissed(f"step {t}: pbs table lacks fresh gradients of partitions "
                                             f"{table.missing(t)} at the deadline")
                    if self.cfg.on_deadline == "partial":
                        break
            ages = table.ages(t)
            decode_began = time.monotonic()
            table.mean(out=self.opt.grad)
            self.opt.step()
            record = {
                "arrivals": arrivals, "used": arrivals, "late": 0, "rejected": [], "deadline_missed": missed,
                "partial": missed, "residual": 0.0, "max_staleness": int(ages.max()),
                "decode_time": time.monotonic() - decode_began, "ages": ages.tolist(), "messages": messages,
                "train_loss": float(np.mean(losses)) if losses else math.nan,
            }
            if self._finish_step(t, began, record):
                break
            t += 1

    # -- shared --------------------------------------------------------------------------------

    def _reject(self, t: int, worker: int, why: str, messages: list[list]) -> None:
        """Count and log a message that must not enter the model; its worker counts as a straggler."""
        self.totals.rejected_messages += 1
        messages.append([worker, -1, math.nan, math.nan, 0, "rejected"])
        log.warning("step %d: rejected a message from worker %d (rank %d): %s", t, worker, worker + 1, why)

    def _rejected(self, t: int, messages: list[list]) -> list[int]:
        """Workers whose last message the transport refused (wrong size), now counted and logged."""
        bad, self.link.malformed[:] = list(self.link.malformed), []
        for worker, why in bad:
            self._reject(t, worker, why, messages)
        return [worker for worker, _ in bad]

    def _sound(self, t: int, worker: int, messages: list[list]) -> bool:
        """Whether a received message is well-formed and finite (a NaN or Inf never enters the model)."""
        header = self.link.headers[worker]
        if int(header[1]) != worker:
            self._reject(t, worker, f"its header names worker {int(header[1])}", messages)
            return False
        if not np.isfinite(self.link.payloads[worker].sum()):
            self._reject(t, worker, "the gradient contains NaN or Inf", messages)
            return False
        return True

    def _signalled(self, t: int) -> bool:
        """Whether a stop signal arrived; the step in progress is then abandoned."""
        name = signals.requested()
        if name is not None and self.totals.stopped_by is None:
            log.warning("%s received during step %d: stopping (metrics are kept; exit status %d asks to requeue)",
                        name, t, signals.EXIT_STOPPED)
            self.totals.stopped_by = name
        return name is not None

    def _finish_step(self, t: int, began: float, record: dict) -> bool:
        """Log the step and evaluate when due; returns True when the target loss is reached."""
        step_time = time.monotonic() - began
        self.totals.steps = t + 1
        due = self.cfg.checkpoint_every and (t + 1) % self.cfg.checkpoint_every == 0
        if (due or self._checkpoint_requested()) and t + 1 < self.cfg.steps:
            self.checkpoint()
        self.totals.skipped += self.n - len(record["used"])
        self.totals.deadline_missed += int(record["deadline_missed"])
        self.metrics.write({"step": t, "wall_time": time.monotonic() - self._started - self._eval_seconds,
                            "step_time": step_time,
                            "bytes_received": self.link.bytes_received, **record})
        if self.cfg.record_params:
            self.trajectory.append(self.w.copy())
        self._recent_losses = [*self._recent_losses[-self.cfg.eval_every + 1:], record["train_loss"]]
        self.progress.update(t, record["train_loss"], step_time, self.totals.skipped)
        last = t + 1 == self.cfg.steps
        stop = self._signalled(t + 1) and not last
        if (t + 1) % self.cfg.eval_every and not last and not stop:
            return False
        mark = time.monotonic()
        ev = self.problem.evaluate(self.w)
        self._eval_seconds += time.monotonic() - mark
        self.totals.last_eval = {"step": t, **ev}
        self.metrics.write({"event": "eval", "step": t, **ev})
        # without a full training-set evaluation, the target is checked on the recent minibatch losses
        train_loss = ev.get("train_loss", float(np.nanmean(self._recent_losses)))
        if self.cfg.target_loss is not None and train_loss <= self.cfg.target_loss:
            log.info("step %d: training loss %.4f reached the target %.4g", t, train_loss, self.cfg.target_loss)
            self.totals.stopped_early = not last
            return True
        return stop
