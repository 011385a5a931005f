"""DropCompute (Giladi et al., NeurIPS 2023), the all-reduce answer to stragglers, for dgd and ddp.

A dgd worker computes its partition gradient as --accumulate K micro-batches. With
--drop-compute SECONDS it starts no micro-batch once its job has run that long: it sends the
micro-batches done (at least one) and the master averages over the micro-batches computed by
every worker, a minibatch of variable size (the paper's rule). The worker sends the sum of its
micro-batch gradients over K and the share m/K it computed (the message header's
`computed_share`); the master divides the sum of the messages by the sum of the shares, which
is the mean over every micro-batch computed, and 1/n of the sum when none was dropped.

A job's time (its computation and its delay, which is slowness of the computation here as for
--abandon-late) is split evenly into its K micro-batches, so the worker stops after micro-batch
m = min(K, floor(threshold / share) + 1): the first that starts past the threshold is dropped.

--drop-compute auto chooses the threshold (AutoThreshold, best_threshold): the one under which
the measured steps would have computed the most micro-batches per second (docs/ALGORITHMS.md §12).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .traits import traits

# The schemes DropCompute applies to (traits: drops_compute): dgd and ddp wait for every worker,
# so shortening the slowest workers' jobs is their only lever (the coded schemes already skip
# stragglers). ddp runs the same rule inside its all-reduce (pgc_mpi.runtime.ddp).


def micro_batches_done(job: float, micro_batches: int, threshold: float) -> int:
    """The micro-batches of a `job`-second job of `micro_batches` equal ones started by `threshold`."""
    share = job / micro_batches
    if share <= 0.0:
        return micro_batches
    return max(1, min(micro_batches, int(threshold // share) + 1))


def stop_after(done: int) -> Callable[[int], bool]:
    """An Accumulated problem's `stop` hook that stops after `done` micro-batches."""
    return lambda computed: computed >= done


# --drop-compute auto: the threshold is chosen from the jobs of these steps, computed whole (the
# paper measures 44 steps after 5 warm-up ones; step 0 is left out here, its first-call costs).
AUTO = "auto"
AUTO_FIRST, AUTO_STEPS = 1, 20


def best_threshold(jobs: np.ndarray, micro_batches: int, overhead: float) -> tuple[float, float, float]:
    """DropCompute's automatic threshold (Giladi et al., §4.3): the one that computes the most
    micro-batches per second over the measured steps. `jobs` (steps x workers) are job times
    computed whole, each split evenly into its `micro_batches`; `overhead` the step's time beyond
    its slowest job (the master's work, the messages' travel). At threshold tau a job computes
    m = micro_batches_done(job, K, tau) and ends at m x share, a step at its slowest job's end plus
    the overhead; the speed is sum(m) / sum(step times). Only the micro-batch starts change it, so
    every start is a candidate; the threshold returned lies midway to the next start (robust to
    rounding and to jobs a little slower than measured). Returns (threshold, its share of the
    micro-batches computed, its speed over keeping them all); math.inf when keeping all is best."""
    jobs = np.asarray(jobs, dtype=float)
    share = jobs / micro_batches
    starts = np.unique((share[..., None] * np.arange(1, micro_batches)).ravel())
    whole = jobs.size * micro_batches / (jobs.max(axis=1).sum() + overhead * len(jobs))
    best = (math.inf, 1.0, 1.0)
    for k, tau in enumerate(starts):
        done = np.clip(np.floor(tau / share) + 1, 1, micro_batches)  # micro_batches_done, vectorized
        speed = done.sum() / ((done * share).max(axis=1).sum() + overhead * len(jobs))
        if speed / whole > best[2]:
            upper = starts[k + 1] if k + 1 < len(starts) else tau + share.max()
            best = (float(tau + upper) / 2, float(done.mean() / micro_batches), float(speed / whole))
    return best


class AutoThreshold:
    """--drop-compute auto: records the measured steps' jobs from their step records (each used
    message's compute time and delay), then picks best_threshold once, after the last of them."""

    def __init__(self, micro_batches: int):
        self.micro_batches = micro_batches
        self.jobs: list[list[float]] = []
        self.overheads: list[float] = []
        self.threshold: float | None = None  # None until chosen

    def observe(self, record: dict) -> dict:
        """Take a step record in; returns the fields to add to it: on the step that decides, the
        threshold chosen (`drop_threshold`, inf: keep every micro-batch) and its predicted share
        and speed-up; otherwise none."""
        step = record["step"]
        if self.threshold is not None or step < AUTO_FIRST:
            return {}
        jobs = [m.compute_time + m.delay for m in record["messages"] if m.verdict == "used"]
        if self.jobs and len(jobs) != len(self.jobs[0]):  # a worker lost or back: not a step like the others
            return {}
        self.jobs.append(jobs)
        self.overheads.append(max(0.0, record["step_time"] - max(jobs)))
        if len(self.jobs) < AUTO_STEPS:
            return {}
        self.threshold, share, speedup = best_threshold(np.array(self.jobs), self.micro_batches,
                                                        float(np.mean(self.overheads)))
        return {"drop_threshold": self.threshold, "drop_threshold_share": share, "drop_threshold_speedup": speedup}

    def chosen(self) -> float | None:
        """The threshold to apply: None while measuring, or when keeping every micro-batch is best."""
        return None if self.threshold is None or math.isinf(self.threshold) else self.threshold


def make_auto(setting: float | str | None, scheme: str, micro_batches: int) -> AutoThreshold | None:
    """The AutoThreshold of a run with --drop-compute auto (of a scheme that drops compute), else None."""
    return AutoThreshold(micro_batches) if setting == AUTO and traits(scheme).drops_compute else None


def fixed_threshold(setting: float | str | None, scheme: str) -> float | None:
    """The threshold of a run with --drop-compute SECONDS (of a scheme that drops compute), else None."""
    return setting if traits(scheme).drops_compute and setting not in (None, AUTO) else None
