"""The one owner of the message layout: named header fields, byte layouts, per-message records.

A gradient message is one contiguous byte buffer: a header of named 8-byte fields (a NumPy
structured dtype, so every reader says `header["step"]`, never `header[0]`), then the payload
(a coded gradient, or one partition's gradient for pbs) in the run's dtype. A model message is
the same with a one-field header (the step). The worker writes a `Message`, the master reads
one, the simulator builds one directly; a `MessageRecord` is what the metrics keep of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# Fields of a gradient message's header, in wire order; then `versions` (one per buffer combined).
GRADIENT_FIELDS: tuple[tuple[str, type], ...] = (
    ("step", np.int64),  # the model version the fresh gradient was computed at
    ("worker", np.int64),  # worker id (MPI rank - 1; rank - K with --servers K)
    ("partition", np.int64),  # pbs: the partition of the gradient; -1 for coded messages
    ("loss", np.float64),  # mean minibatch loss of the fresh gradient(s)
    ("compute_time", np.float64),  # seconds spent computing gradients for this message (emulated: at least
    #                                 --compute-time per gradient)
    ("real_compute_time", np.float64),  # of which the gradient computations themselves (the rest is sleep)
    ("delay", np.float64),  # injected straggler delay in seconds
    ("gradients", np.int64),  # partition gradients computed for this message
    ("computed_share", np.float64),  # of its micro-batches (1: all; less when DropCompute cut them short)
    ("data_wait", np.float64),  # of compute_time, the seconds spent getting minibatches (nan: not measured)
)
MODEL_HEADER = np.dtype([("step", np.int64)])


def gradient_header(versions: int) -> np.dtype:
    """The header dtype of a gradient message combining `versions` buffers."""
    return np.dtype([*GRADIENT_FIELDS, ("versions", np.int64, (versions,))])


def buffers_per_message(scheme) -> int:
    """How many buffer versions a scheme's messages carry: c for coded schemes, 1 for pbs."""
    return 1 if scheme.kind == "table" else scheme.c


class Layout:
    """A message's bytes: a header of structured dtype `header`, then `dim` values of `dtype`."""

    def __init__(self, header: np.dtype, dim: int, dtype: np.dtype | type):
        self.header, self.dim, self.dtype = np.dtype(header), dim, np.dtype(dtype)
        self.nbytes = self.header.itemsize + dim * self.dtype.itemsize

    def allocate(self, rows: int = 1) -> np.ndarray:
        """Zeroed contiguous bytes for `rows` messages."""
        return np.zeros((rows, self.nbytes), dtype=np.uint8)

    def split(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(header, payload) views of one message's bytes; the header is a 0-d structured array
        whose fields read and write in place (`header["step"] = 3`)."""
        cut = self.header.itemsize
        return buf[:cut].view(self.header).reshape(()), buf[cut:].view(self.dtype)


@dataclass
class Message:
    """A gradient message's header, by name."""

    step: int
    worker: int
    versions: tuple[int, ...]
    partition: int = -1
    loss: float = math.nan
    compute_time: float = 0.0
    delay: float = 0.0
    gradients: int = 1
    real_compute_time: float = math.nan  # nan where nothing real was computed (the simulator)
    computed_share: float = 1.0  # --drop-compute: the share of the micro-batches computed (core.drop_compute)
    data_wait: float = math.nan  # of compute_time, getting the minibatches (nan where not measured: the simulator)
    # Not on the wire: the receiver's own measure (MessageRecord.turnaround), set before the record
    turnaround: float = math.nan

    def write(self, header: np.ndarray) -> None:
        """Fill a header view (from Layout.split) with this message's fields."""
        for name, _ in GRADIENT_FIELDS:
            header[name] = getattr(self, name)
        header["versions"] = self.versions

    @classmethod
    def read(cls, header: np.ndarray) -> Message:
        """The message a header view holds."""
        fields = {name: header[name].item() for name, _ in GRADIENT_FIELDS}
        return cls(versions=tuple(int(v) for v in header["versions"]), **fields)

    def record(self, verdict: str) -> MessageRecord:
        """What the metrics keep of this message, with the master's verdict on it."""
        return MessageRecord(self.worker, self.step, self.delay, self.compute_time, self.gradients, verdict,
                             self.real_compute_time, self.turnaround, self.data_wait)


class _RecordFields(NamedTuple):
    worker: int
    step: int
    delay: float
    compute_time: float
    gradients: int
    verdict: str
    real_compute_time: float = math.nan
    turnaround: float = math.nan
    data_wait: float = math.nan


class MessageRecord(_RecordFields):
    """One received message in a step record's `messages` list (stored as a JSON list in this order).

    verdict: `used` (entered the update), `accepted` (arrived in time, not needed), `late` (for
    an earlier step), `stale` (over --max-staleness; for pbs: older than the table's entry),
    `rejected` (malformed or non-finite: step, delay and compute time are then unknown).
    compute_time is the time the worker spent on the message's gradients, at least
    --compute-time per gradient when a cluster's compute is emulated; real_compute_time is the
    part spent computing (nan in the simulator and in records written before it existed).
    turnaround is the master's own measure: seconds from its send of the model the message was
    computed at (its `step`) to the message's arrival (when the master took it in), so
    turnaround - compute_time is what the worker took beyond its computation: injected delay,
    communication, any hold-up (pgc_mpi.runs.delays). In the simulator: simulated seconds from
    the model reaching the worker to the master taking the message in. nan where unknown:
    rejected messages, ddp, and records written before it existed. data_wait is the part of
    compute_time the worker spent getting its minibatches: reading them, or waiting for the
    loaders that read them ahead (--loader-workers); a slow data pipeline shows here, a slow node
    does not (0 for the NumPy problems, which hold their rows; nan in the simulator and in records
    written before it existed). --compute-time emulates the model's computation: the
    data wait comes on top of it, as a node's loading does."""

    __slots__ = ()

    @classmethod
    def _make(cls, iterable) -> MessageRecord:  # type: ignore[override]
        """A record from its JSON list; lists written before real_compute_time, turnaround or
        data_wait existed (6 to 8 values) get nan for the fields they lack."""
        values = list(iterable)
        if len(cls._fields) - 3 <= len(values) < len(cls._fields):
            values += [math.nan] * (len(cls._fields) - len(values))
        return tuple.__new__(cls, values) if len(values) == len(cls._fields) else super()._make(values)

    @classmethod
    def rejected(cls, worker: int) -> MessageRecord:
        """The record of a message refused before its header could be trusted."""
        return cls(worker, -1, math.nan, math.nan, 0, "rejected")
