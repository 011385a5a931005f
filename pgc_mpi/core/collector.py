"""The master's per-step rules, one collector per kind of scheme, with no clock and no MPI.

The MPI master, the simulator and `replay` all drive a collector through the same calls:
`begin(step)`, `offer(message, payload)` for every message that arrives, `ready()`, `decode()`
(or `on_deadline(policy)` when the deadline passes), then `record(decoded, missed)` for the
step's log line. So both drivers take the same decisions on the same arrivals, and a step
record has one layout whoever wrote it.

- CodedCollector (every scheme but pbs): one coded message per worker and step, decoded with
  the scheme's weights. Decoders whose weights are one common factor (averages, FR groups)
  add each counted message into the gradient as it arrives (`streams`); the others hold the
  payloads until the decode (`held`: the driver must not reuse those buffers before then).
- TableCollector (pbs): every message is one partition's gradient and goes into the
  partition table; the step is ready when the table is fresh.

A payload may also be given lazily, as a callable that computes it (the simulator does): it is
then called only if the message enters the gradient or the table, never for a late, over-stale,
uncounted or unused one. The MPI master passes the received buffer itself. A message's minibatch
loss may be lazy too (`offer(..., loss=callable)`): it is asked for only if the message is used.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import NotDecodable, PgcError
from .message import Message, MessageRecord
from .schemes import CodedScheme, PbsScheme, staleness
from .traits import traits

Payload = np.ndarray | Callable[[], np.ndarray]  # a message's vector, or a callable that computes it
LazyLoss = Callable[[], float] | None  # a message's minibatch loss computed on demand (None: the message's own)


def resolve(payload: Payload) -> np.ndarray:
    """The payload's vector, computed now if it was given lazily."""
    return payload() if callable(payload) else payload


class DeadlineMissed(PgcError):
    """The decode condition did not hold by the deadline and the policy is `fail`."""


@dataclass
class Decoded:
    """The outcome of a step: which messages entered the gradient and how exact it is.

    `weights` are the decode weights over all n workers (None for pbs, whose gradient is the
    table's mean); `residual` is ||a^T B - 1/n|| (pbs: the same for the table's coverage)."""

    weights: np.ndarray | None
    used: list[int]
    residual: float
    max_staleness: int
    partial: bool


class _Collector:
    """What both collectors share: the step, its arrivals, messages and losses."""

    # An on-time message is answered with the next step's model (coded schemes: the worker then
    # computes for that step), or at once with the current model unless it completed the step
    # (pbs: its worker computes again, and the one that triggers step t restarts from w_{t+1}).
    answers_every_message: bool
    waits_on = "workers"  # what waiting_for() lists

    def __init__(self, n: int, grad: np.ndarray, max_staleness: int | None, first: int):
        self.n, self.grad, self.max_staleness = n, grad, max_staleness
        self.first = first  # the run's first step: warm-up buffers are computed at its model
        self.step = -1
        self.begin(0)

    def begin(self, step: int) -> None:
        """Start collecting for `step` (zeroes the gradient buffer)."""
        self.step = step
        self.arrived: list[int] = []
        self.late = 0
        self.rejected: list[int] = []  # over --max-staleness
        self.messages: list[MessageRecord] = []
        self.losses: list[tuple[int, float | Callable[[], float]]] = []  # (worker, minibatch loss) of each accepted
        self.held: dict[int, Payload] = {}  # payloads kept for the decode: not to be overwritten before
        self.grad[...] = 0.0

    def note_rejected(self, worker: int) -> None:
        """Record a message the driver refused before offering it (malformed, non-finite)."""
        self.messages.append(MessageRecord.rejected(worker))

    def _staleness(self, version: int) -> int:
        return staleness(self.step, version, self.first)

    def _too_stale(self, oldest: int) -> bool:
        return self.max_staleness is not None and self._staleness(oldest) > self.max_staleness

    def waiting_for(self) -> list[int]:
        """Workers with no message accepted this step."""
        return [i for i in range(self.n) if i not in self.arrived]

    def record(self, dec: Decoded, missed: bool) -> dict:
        """The scheme's part of the step record (the driver adds its clock and counters)."""
        used = set(dec.used)
        messages = [m._replace(verdict="used") if m.verdict == "accepted" and m.worker in used else m
                     for m in self.messages]
        return {"arrivals": list(self.arrived), "used": list(dec.used), "late": self.late,
                "rejected": list(self.rejected), "stale_rejected": len(self.rejected),
                "deadline_missed": missed, "partial": dec.partial,
                "residual": dec.residual, "max_staleness": dec.max_staleness, "messages": messages,
                "train_loss": self._train_loss(dec.used)}

    def _train_loss(self, used: list[int]) -> float:
        """Mean minibatch loss of the messages that entered the update."""
        chosen = set(used)
        losses = [loss() if callable(loss) else loss for worker, loss in self.losses if worker in chosen]
        return float(np.mean(losses)) if losses else math.nan


class CodedCollector(_Collector):
    """Arrivals of one step of a coded scheme, in order, and the verdict on every message."""

    answers_every_message = False

    def __init__(self, scheme: CodedScheme, grad: np.ndarray, max_staleness: int | None = None, first: int = 0):
        self.scheme = scheme
        super().__init__(scheme.n, grad, max_staleness, first)

    def begin(self, step: int) -> None:
        super().begin(step)
        self.versions: dict[int, list[int]] = {}
        self.refreshed = 0  # catch-up gradients (--on-stale refresh) in this step's messages
        self.summed: list[int] = []  # messages already added into grad (streaming decoders)
        self.shares = 0.0  # the summed messages' computed shares (< their count once --drop-compute dropped)
        self._tracker = self.scheme.tracker()

    def offer(self, msg: Message, payload: Payload, loss: LazyLoss = None) -> str:
        """Record a message; returns 'accepted', 'late', 'stale', 'duplicate', 'unknown' or 'future'.

        Only 'accepted', 'late' and 'stale' are recorded; the others are the driver's to reject."""
        if msg.step > self.step:
            return "future"
        if not 0 <= msg.worker < self.n:
            return "unknown"
        self.refreshed += max(0, msg.gradients - len(self.scheme.fresh_slots(msg.step, msg.worker)))
        if msg.step < self.step:
            self.late += 1
            verdict = "late"
        elif msg.worker in self.versions:
            return "duplicate"
        elif self._too_stale(min(msg.versions)):
            self.rejected.append(msg.worker)
            verdict = "stale"
        else:
            verdict = "accepted"
            self._accept(msg, payload, loss)
        self.messages.append(msg.record(verdict))
        return verdict

    def _accept(self, msg: Message, payload: Payload, loss: LazyLoss) -> None:
        i = msg.worker
        self.arrived.append(i)
        self.versions[i] = list(msg.versions)
        self.losses.append((i, msg.loss if loss is None else loss))
        self._tracker.add(i)
        if not self.scheme.streams:
            self.held[i] = payload
        elif self._tracker.counted:  # decode while waiting: add it now
            self.grad += resolve(payload)
            self.summed.append(i)
            self.shares += msg.computed_share

    def ready(self) -> bool:
        """Whether the scheme's decode condition holds for the arrivals so far."""
        return self._tracker.is_ready()

    def decode(self, partial: bool = False) -> Decoded:
        """g_hat = sum_i a_i m_i into the gradient buffer (NotDecodable when the arrivals are not enough).

        A streaming decoder has summed its messages already (their weights are one common
        factor): only the scaling is left. Otherwise the held payloads are combined now."""
        a = self.scheme.decode_weights(self.arrived, partial=partial)
        used = [i for i in self.arrived if a[i] != 0.0]
        if self.summed:
            if self.summed != used:
                raise RuntimeError(f"streamed {self.summed} but the decoder used {used}")
            # dgd with --drop-compute: the mean over the micro-batches computed (core.drop_compute)
            dropped = traits(self.scheme.name).drops_compute and self.shares < len(self.summed)
            self.grad *= self.grad.dtype.type(1.0 / self.shares if dropped else a[used[0]])
        else:
            for i in used:
                self.grad += self.grad.dtype.type(a[i]) * resolve(self.held[i])
        stale = max((self._staleness(min(self.versions[i])) for i in used), default=0)
        return Decoded(a, used, self.scheme.residual(a), stale, partial)

    def on_deadline(self, policy: str) -> Decoded | None:
        """Apply the deadline policy: a partial decode, None to keep waiting, or DeadlineMissed."""
        if policy == "fail":
            raise DeadlineMissed(
                f"step {self.step}: {self.scheme.name} could not decode by the deadline "
                f"({len(self.arrived)} of {self.n} workers arrived; missing workers {self.waiting_for()})"
            )
        if policy == "partial":
            try:
                return self.decode(partial=True)
            except NotDecodable:
                return None
        return None

    def record(self, dec: Decoded, missed: bool) -> dict:
        dropped = {"computed_share": self.shares / len(self.summed)} if self.shares < len(self.summed) else {}
        return {**super().record(dec, missed), "versions": dict(self.versions), "refreshed": self.refreshed, **dropped}


class TableCollector(_Collector):
    """pbs: every message is one partition's gradient for the partition table.

    A newer gradient replaces its partition's entry; the step is ready once every entry is
    younger than the window and at least one entry was replaced since the previous step (a step
    never re-applies the previous aggregate)."""

    answers_every_message = True
    waits_on = "partitions"

    def __init__(self, scheme: PbsScheme, grad: np.ndarray, max_staleness: int | None = None, first: int = 0):
        self.scheme = scheme
        self.table = scheme.new_table(grad.size, grad.dtype)
        super().__init__(scheme.n, grad, max_staleness, first)

    def begin(self, step: int) -> None:
        super().begin(step)
        self.changed: set[int] = set()  # partitions whose entry was replaced since the previous step

    def offer(self, msg: Message, payload: Payload, loss: LazyLoss = None) -> str:
        """Offer a partition gradient to the table; returns 'used' (it replaced the entry),
        'stale' (older than the entry, or over --max-staleness), or 'unknown' (bad ids). A lazy
        payload is computed only when it replaces the entry."""
        if not (0 <= msg.worker < self.n and 0 <= msg.partition < self.n) or msg.step > self.step:
            return "unknown" if msg.step <= self.step else "future"
        if self._too_stale(msg.step):
            self.rejected.append(msg.worker)
            verdict = "stale"
        else:
            verdict = "used" if self.table.offer(msg.partition, msg.step, payload) else "stale"
            if verdict == "used":  # the step's loss is that of the gradients that entered the table
                self.changed.add(msg.partition)
                self.losses.append((msg.worker, msg.loss if loss is None else loss))
            self.arrived.append(msg.worker)
        self.messages.append(msg.record(verdict))
        return verdict

    def ready(self) -> bool:
        """Whether the table is fresh at this step and an entry changed since the last one."""
        return bool(self.changed) and self.table.ready(self.step)

    def decode(self, partial: bool = False) -> Decoded:
        """The table's mean into the gradient buffer. A partial decode uses whatever the table
        holds; partitions never filled count as zero gradients (their weight is missing)."""
        if not partial and not self.ready():
            raise NotDecodable(f"pbs: partitions {self.table.missing(self.step)} have no fresh gradient")
        self.table.mean(out=self.grad)
        ages = self.table.ages(self.step)
        residual = float(np.sqrt(np.count_nonzero(ages < 0))) / self.n
        return Decoded(None, list(self.arrived), residual, int(ages.max()), partial)

    def on_deadline(self, policy: str) -> Decoded | None:
        """The deadline policy for the table: decode what it holds (once an entry has changed since
        the previous step: never the previous aggregate again), keep waiting, or fail."""
        if policy == "fail":
            raise DeadlineMissed(f"step {self.step}: pbs table lacks fresh gradients of partitions "
                                 f"{self.table.missing(self.step)} at the deadline")
        return self.decode(partial=True) if policy == "partial" and self.changed else None

    def waiting_for(self) -> list[int]:
        """For pbs: the partitions without a fresh gradient (every worker computes all the time)."""
        return self.table.missing(self.step)

    def record(self, dec: Decoded, missed: bool) -> dict:
        return {**super().record(dec, missed), "ages": self.table.ages(self.step).tolist(),
                "new_gradients": len(self.changed)}


def make_collector(scheme: CodedScheme | PbsScheme, grad: np.ndarray, max_staleness: int | None = None,
                   first: int = 0) -> CodedCollector | TableCollector:
    """The collector of a scheme, decoding into `grad` (the optimizer's gradient buffer), that
    rejects messages with a buffer older than `max_staleness` steps (None: no bound) in a run
    whose first step (its warm-up model) is `first`."""
    if isinstance(scheme, PbsScheme):
        return TableCollector(scheme, grad, max_staleness, first)
    return CodedCollector(scheme, grad, max_staleness, first)
