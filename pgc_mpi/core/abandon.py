"""Abandoning a decided step (--abandon-late): which schemes may, and where a worker can stop.

A worker still computing for step t once the master has decided step t without it would send a
message that arrives late and is discarded (docs/ALGORITHMS.md §5, the newest-model rule), and
only then take the newest model: one slow step costs it two. With --abandon-late it stops at its
next check point instead, keeps nothing of the abandoned job (its buffers and their versions stay
as they were, exactly as for a worker that skipped the step), sends nothing for it, and starts
on the newest model. A worker's first job of a start is never abandoned: it computes the fresh
slot that a pipelined scheme's warm-up leaves empty (a buffer that was never computed must not
be sent as a gradient), and the other schemes keep one rule. Every message that is sent is one
the scheme already accepts, so decoding stays exact (FR, gc-cr) or unbiased (is-sgd, is-gc-*,
pgc-cr) as without it. A pipelined worker may pay for it later: under the default staleness
window the abandoned slot's buffer is a step past the bound when it is next sent, so --on-stale
refresh recomputes it (reject: its messages are rejected). Such a worker drops a job only where
more of it is left than that one partition gradient (drop_costs_a_gradient, abandon_margin);
under a looser --max-staleness, or none, and for the other schemes, dropping costs nothing and a
decided job is dropped at any check point.

A job's time (its computation and its delay: the delay models slowness of the computation,
spread evenly over it) is split into its micro-batches (the partition gradients it computes times
--accumulate); the worker checks after each micro-batch's forward pass and between micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .schemes import staleness
from .traits import traits

if TYPE_CHECKING:
    from .schemes import CodedScheme

# The forward pass's share of a micro-batch's computation (a backward costs about twice a forward),
# so a single-batch step has one check point, a third of the way in, before its backward pass.
FORWARD_SHARE = 1 / 3


def abandons(scheme: str) -> bool:
    """Whether a worker of `scheme` may abandon a decided step (dgd and ddp decide a step only with
    every worker's message, so none is ever moot; pbs's table takes a late gradient if it is newer
    than its entry: pgc_mpi.core.traits)."""
    return traits(scheme).abandons


def check_points(began: float, until: float, micro_batches: int) -> list[float]:
    """When a job running from `began` to `until` over `micro_batches` equal micro-batches checks
    for a decided step: after each forward pass, and at the end of every micro-batch but the last
    (whose end is the message's sending)."""
    share = (until - began) / micro_batches
    points = []
    for j in range(micro_batches):
        points.append(began + (j + FORWARD_SHARE) * share)
        if j < micro_batches - 1:
            points.append(began + (j + 1) * share)
    return points


def drop_costs_a_gradient(scheme: CodedScheme, worker: int, step: int, slots: Sequence[int],
                          versions: Sequence[int], bound: int | None, first: int = 0) -> bool:
    """Whether dropping `worker`'s job for `step` (it computes `slots`; their buffers keep
    `versions`) sends one of them past the staleness `bound` before the slot's next fresh turn
    (its messages of steps step + 1 .. turn - 1 carry it): that buffer is then recomputed first
    (--on-stale refresh) or the message rejected (reject). Never without a bound or stored
    buffers (only pgc-* has them)."""
    if bound is None or not scheme.pipelined:
        return False
    for k in slots:
        turn = next((u for u in range(step + 1, step + scheme.c + 1) if k in scheme.fresh_slots(u, worker)),
                    step + scheme.c)
        if turn - 1 > step and staleness(turn - 1, versions[k], first) > bound:
            return True
    return False


def abandon_margin(drop_costs: bool, gradient_time: float) -> float:
    """How much of a decided job must be left after a check point for the worker to drop it there:
    where dropping costs a partition gradient later (drop_costs_a_gradient), that gradient's time
    (`gradient_time`: its compute without the delay, which is this job's and not the refresh's),
    since dropping less than that loses time; otherwise nothing (0)."""
    return gradient_time if drop_costs else 0.0


def worth_abandoning(left: float, margin: float) -> bool:
    """Whether a decided job with `left` seconds still to run is dropped (margin: abandon_margin)."""
    return left > margin


def next_check_point(began: float, until: float, micro_batches: int, told: float,
                     margin: float = 0.0) -> float | None:
    """The first check point at or after `told` (when the worker learns its step is decided) that
    leaves more than `margin` of the job (abandon_margin), or None when there is none before the
    job ends (it then finishes and its message is late)."""
    return next((p for p in check_points(began, until, micro_batches)
                 if p >= told and worth_abandoning(until - p, margin)), None)
