"""Partitions and the per-partition minibatch schedule."""

from __future__ import annotations

import numpy as np
import pytest

from pgc_mpi.core.sampling import minibatch_positions, partition_indices
from pgc_mpi.errors import ConfigError


@pytest.mark.parametrize("samples,n", [(10, 3), (1437, 12), (7, 7), (100, 1)])
def test_partitions_are_disjoint_cover_everything_and_differ_by_at_most_one(samples, n):
    parts = partition_indices(samples, n, seed=5)
    assert len(parts) == n
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(samples))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition_indices(samples, n, seed=5)))


def test_fewer_samples_than_partitions_is_a_clear_error():
    with pytest.raises(ConfigError, match="3 training samples, fewer than the 4 partitions"):
        partition_indices(3, 4, seed=0)


@pytest.mark.parametrize("size,batch", [(10, 3), (12, 4), (5, 10), (7, 1)])
def test_each_pass_covers_the_partition_once_and_passes_are_reshuffled(size, batch):
    per_pass = -(-size // batch) if batch < size else 1
    passes = [np.concatenate([minibatch_positions(size, batch, e * per_pass + k, seed=1, partition=2)
                              for k in range(per_pass)]) for e in range(3)]
    for p in passes:
        assert np.array_equal(np.sort(p), np.arange(size))
    if batch < size and size > 2:
        assert any(not np.array_equal(passes[0], q) for q in passes[1:])


def test_whole_partition_when_no_batch_size():
    assert np.array_equal(minibatch_positions(6, None, 17, seed=0, partition=0), np.arange(6))
