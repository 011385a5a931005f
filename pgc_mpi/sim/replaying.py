"""Replaying a recorded run: its parameters recomputed from the arrivals and message versions its
master logged, through the same collectors (the check that a run decoded what it should have)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from ..core.collector import make_collector
from ..core.message import Message
from ..core.schemes import CodedScheme, PbsScheme
from ..core.wire import wire_format
from ..learning.optim import FlatOptimizer
from ..learning.problems import Problem
from .messages import MessageBuilder

if TYPE_CHECKING:
    from ..runs.checkpoint import Checkpoint


def replay(scheme: CodedScheme | PbsScheme, problem: Problem, steps: Iterable[dict], optimizer: str = "sgd",
           lr: float = 0.05, momentum: float = 0.9, wire_dtype: str | None = None,
           start: Checkpoint | None = None) -> list[np.ndarray]:
    """Recompute a recorded run's parameters from its arrivals and message versions.

    Each item of `steps` has 'arrivals' (worker ids in order), 'versions' ({worker: the
    versions of its message's buffers}, keys may be strings as in JSON) and optionally
    'partial', as the MPI master logs them. For pbs it has 'messages' instead (every message
    the master took in that step, in its order, as the MPI master logs them): each enters the
    table in that order and the step decodes after the last, as the master did (with the
    learning rate the record's 'lr' says, where --adapt changed it); a worker's k-th message
    since the run (or its resumption) started is its k-th computation, which fixes its partition
    and minibatch. `wire_dtype`: the run's --wire-dtype (messages are rounded to it as the
    workers rounded them). `start`: the checkpoint a resumed run started from (its parameters,
    optimizer state and pbs table; `steps` are then the records from its step on). Returns w_0,
    w_1, ... (from start.step on).
    """
    first = 0 if start is None else start.step
    w = (problem.initial_params() if start is None else start.params).astype(np.float64)
    opt = FlatOptimizer(w, optimizer, lr, momentum=momentum)
    builder = MessageBuilder(scheme, problem)
    builder.add_model(first, w)
    collector = make_collector(scheme, opt.grad, first=first)
    if start is not None:
        opt.opt.load_state_dict(start.optimizer)
        opt.opt.param_groups[0]["lr"] = lr
        if start.table_grads is not None:
            collector.table.grads[...], collector.table.versions[...] = start.table_grads, start.table_versions
    wire = wire_format(wire_dtype, np.float64)
    counts = [0] * scheme.n  # pbs: each worker's computations so far
    out = [w.copy()]
    for t, rec in enumerate(steps, start=first):
        collector.begin(t)
        if isinstance(scheme, PbsScheme):
            for message in rec["messages"]:
                worker, version, verdict = int(message[0]), int(message[1]), message[5]
                count, counts[worker] = counts[worker], counts[worker] + 1
                if verdict != "rejected":
                    slot = scheme.fresh_slots(count, worker)[0]
                    part = scheme.placement[worker][slot]
                    grad = builder.gradient(part, version, scheme.draw_index(count, slot))
                    collector.offer(Message(version, worker, (version,), partition=part), wire.round_trip(grad))
        else:
            versions = {int(k): v for k, v in rec["versions"].items()}
            for i in map(int, rec["arrivals"]):
                collector.offer(Message(t, i, tuple(versions[i])), wire.round_trip(builder.message(i, t, versions[i])))
        collector.decode(partial=rec.get("partial", False))
        if "lr" in rec:  # the rate the step used (a schedule's, or --adapt's change; older records: only the latter)
            opt.opt.param_groups[0]["lr"] = rec["lr"]
        opt.step()
        builder.add_model(t + 1, w)
        out.append(w.copy())
    return out
