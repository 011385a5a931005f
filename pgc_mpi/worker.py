"""A worker rank: newest model in, one (or c) partition gradients computed, a coded message out."""

from __future__ import annotations

import logging
import math
import os
import time

import numpy as np

from .faults import Fault, active
from .message import Message
from .problems import Problem
from .schemes import CodedScheme, PbsScheme
from .stragglers import DelayModel
from .transport import WorkerTransport

log = logging.getLogger("pgc_mpi")

def _injected_delay(seconds: float, link: WorkerTransport) -> float:
    """Sleep like a slow node. A hang never wakes (as a real one would not); a finite delay
    ends early if the master asks to stop, since its result would be discarded anyway."""
    if seconds == math.inf:
        log.warning("injected hang: this worker stops responding now")
        while True:
            time.sleep(3600)
    until = time.monotonic() + seconds
    while time.monotonic() < until and not link.stop_requested():
        time.sleep(min(0.01, max(0.0, until - time.monotonic())))
    return seconds


def _send(link: WorkerTransport, faults: list[Fault], worker: int, step: int) -> None:
    """Send the message in the link's buffers, spoiled first if a fault is injected here."""
    kind = active(faults, worker, step)
    if kind == "die":
        log.warning("injected fault: this worker dies now")
        os._exit(17)
    if kind in ("nan", "inf"):
        link.payload[0] = np.nan if kind == "nan" else np.inf
    link.send(nbytes=link.nbytes // 2 if kind == "badsize" else None)


def run_worker(worker: int, scheme: CodedScheme | PbsScheme, problem: Problem, link: WorkerTransport,
               delays: DelayModel, faults: list[Fault] | None = None, refresh_over: int | None = None) -> int:
    """Serve the master until it says stop; returns how many gradients were computed.

    A pipelined worker that finds buffers older than `refresh_over` steps (it missed steps)
    recomputes them at the current model before it sends (--on-stale refresh; None: never)."""
    faults = faults or []
    if isinstance(scheme, PbsScheme):
        return _run_table_worker(worker, scheme, problem, link, delays, faults)
    parts = scheme.placement[worker]
    coef = scheme.coefficients(worker).astype(link.payload.dtype)
    buffers = np.zeros((scheme.c, problem.dim), dtype=link.payload.dtype)
    step = first = link.next_model()
    computed = 0
    if step is not None:  # the first model: step 0, or the step a resumed run starts at
        versions = scheme.warmup_versions(step)
        for k in scheme.warmup_slots(worker, step):  # the pipeline's stale buffers, at this model
            buffers[k] = problem.loss_and_grad(link.model, parts[k], scheme.draw_index(versions[k], k))[1]
            computed += 1
    while step is not None:
        losses = []
        began = time.perf_counter()
        catch_up = scheme.refresh_slots(worker, step, versions, refresh_over, first)
        for k in (*catch_up, *scheme.fresh_slots(step, worker)):
            loss, buffers[k] = problem.loss_and_grad(link.model, parts[k], scheme.draw_index(step, k))
            versions[k] = step
            losses.append(loss)
        np.dot(coef, buffers, out=link.payload)
        took = time.perf_counter() - began
        computed += len(losses)
        slept = _injected_delay(delays.delay(worker, step), link)
        Message(step, worker, tuple(versions), loss=float(np.mean(losses)), compute_time=took, delay=slept,
                gradients=len(losses)).write(link.header)
        _send(link, faults, worker, step)
        step = link.next_model()
    link.confirm_stop()
    return computed


def _run_table_worker(worker: int, scheme: PbsScheme, problem: Problem, link: WorkerTransport,
                      delays: DelayModel, faults: list[Fault]) -> int:
    """pbs: compute the next stored partition at the model the master answered with, again and
    again (the answer to the message that completes a step is the updated model)."""
    version = link.next_model()
    count = 0
    attempts = 0
    while version is not None:
        slot = scheme.fresh_slots(count, worker)[0]
        part = scheme.placement[worker][slot]
        began = time.perf_counter()
        loss, link.payload[:] = problem.loss_and_grad(link.model, part, scheme.draw_index(count, slot))
        took = time.perf_counter() - began
        slept = _injected_delay(delays.delay(worker, version, attempts), link)
        Message(version, worker, (version,), partition=part, loss=loss, compute_time=took,
                delay=slept).write(link.header)
        _send(link, faults, worker, version)
        count += 1
        answer = link.next_model()
        attempts = attempts + 1 if answer == version else 0
        version = answer
    link.confirm_stop()
    return count
