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
"""

from __future__ import annotations

from collections.abc import Callable

# The schemes DropCompute applies to: dgd and ddp wait for every worker, so shortening the
# slowest workers' jobs is their only lever (the coded schemes already skip stragglers). ddp runs
# the same rule inside its all-reduce (pgc_mpi.runtime.ddp).
DROPS_COMPUTE = ("dgd", "ddp")


def micro_batches_done(job: float, micro_batches: int, threshold: float) -> int:
    """The micro-batches of a `job`-second job of `micro_batches` equal ones started by `threshold`."""
    share = job / micro_batches
    if share <= 0.0:
        return micro_batches
    return max(1, min(micro_batches, int(threshold // share) + 1))


def stop_after(done: int) -> Callable[[int], bool]:
    """An Accumulated problem's `between` that stops after `done` micro-batches."""
    return lambda computed: computed >= done
