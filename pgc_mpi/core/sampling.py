"""Splitting a data set into n partitions and drawing each partition's minibatches.

Both are pure functions of a seed, so every rank (and the simulator) derives the same
partitions and the same minibatch for a given (partition, draw index) without communicating.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError


def partition_indices(num_samples: int, n: int, seed: int) -> list[np.ndarray]:
    """n disjoint partitions of range(num_samples) from a seeded permutation; sizes differ by <= 1.

    Each partition's indices are sorted (cheap contiguous reads from HDF5).
    """
    if num_samples < n:
        raise ConfigError(
            f"the data set has {num_samples} training samples, fewer than the {n} partitions "
            f"(one per worker): use fewer workers or a larger data set"
        )
    perm = np.random.default_rng([seed, 0x5A3D]).permutation(num_samples)
    return [np.sort(part) for part in np.array_split(perm, n)]


def minibatch_positions(size: int, batch_size: int | None, draw: int, seed: int, partition: int) -> np.ndarray:
    """Positions (0..size-1) within a partition of its `draw`-th minibatch.

    The partition is reshuffled every pass (epoch); a pass has ceil(size / batch_size) batches
    and the last one may be smaller. batch_size None (or >= size) means the whole partition.
    """
    if batch_size is None or batch_size >= size:
        return np.arange(size)
    per_pass = -(-size // batch_size)
    epoch, k = divmod(draw, per_pass)
    perm = np.random.default_rng([seed, partition, epoch, 0xB47C]).permutation(size)
    return np.sort(perm[k * batch_size:(k + 1) * batch_size])


def draw_seed(seed: int, partition: int, draw: int) -> int:
    """The seed of torch's generator while the `draw`-th minibatch of `partition` is read and
    computed: a random transform or dropout then draws the same on every worker that holds the
    partition, so gradient coding's copies agree and decoding stays exact."""
    state = np.random.SeedSequence([seed, partition, draw, 0x70C4]).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))
