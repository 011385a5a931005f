"""--servers K without MPI: the shards, the optimizer state cut and put together, the configuration's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pgc_mpi.config import TrainConfig
from pgc_mpi.errors import ConfigError
from pgc_mpi.optim import FlatOptimizer
from pgc_mpi.servers import merge_states, shard_bounds, slice_state


@pytest.mark.parametrize("dim,servers", [(10, 1), (10, 3), (7, 7), (1_000_003, 4)])
def test_shards_are_contiguous_cover_the_vector_and_differ_by_at_most_one(dim, servers):
    shards = shard_bounds(dim, servers)
    assert len(shards) == servers and shards[0].start == 0 and shards[-1].stop == dim
    assert all(a.stop == b.start for a, b in zip(shards, shards[1:], strict=False))
    sizes = [s.stop - s.start for s in shards]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_more_servers_than_parameters_is_refused():
    with pytest.raises(ConfigError, match=r"^--servers 4 is more than the model's 3 parameters: .* use --servers 3"):
        shard_bounds(3, 4)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
def test_shard_optimizers_step_like_the_whole_one_and_their_states_merge_to_its(name):
    """Every optimizer here is elementwise: K optimizers on the shards are the one on the vector,
    and the shards' state_dicts put together are the whole one's (what a checkpoint stores)."""
    rng = np.random.default_rng(0)
    dim, shards = 11, shard_bounds(11, 3)
    whole_w = rng.normal(size=dim)
    parts_w = whole_w.copy()
    whole = FlatOptimizer(whole_w, name, 0.1)
    parts = [FlatOptimizer(parts_w[s], name, 0.1) for s in shards]
    for _ in range(3):
        g = rng.normal(size=dim)
        whole.grad[:] = g
        whole.step()
        for s, opt in zip(shards, parts, strict=True):
            opt.grad[:] = g[s]
            opt.step()
    np.testing.assert_allclose(parts_w, whole_w, rtol=0, atol=1e-15)
    merged = merge_states([opt.opt.state_dict() for opt in parts])
    reference = whole.opt.state_dict()
    assert merged["param_groups"] == reference["param_groups"]
    assert merged["state"].keys() == reference["state"].keys()
    for key, value in reference["state"].get(0, {}).items():
        torch.testing.assert_close(merged["state"][0][key], value)
    # and cut again, each shard's state is its own
    for s, opt in zip(shards, parts, strict=True):
        cut = slice_state(reference, s, dim)
        for key, value in opt.opt.state_dict()["state"].get(0, {}).items():
            torch.testing.assert_close(cut["state"][0][key], value)


@pytest.mark.parametrize("scheme,match", [
    ("pbs", r"^--servers 2: pbs steps on arrivals, which servers see in different orders"),
    ("ddp", r"^--servers 2: --scheme ddp has no parameter server"),
])
def test_schemes_without_whole_steps_on_a_server_refuse_servers(scheme, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(scheme=scheme, servers=2).validate(4)


def test_servers_must_leave_a_worker_and_be_positive():
    cfg = TrainConfig(servers=3)
    with pytest.raises(ConfigError, match=r"--servers 3 needs at least 4 MPI ranks \(ranks 0\.\.2 are the servers"):
        cfg.validate(cfg.workers_of(3))
    with pytest.raises(ConfigError, match=r"--servers must be a positive integer"):
        TrainConfig(servers=0).validate(4)
    assert TrainConfig(servers=3).workers_of(7) == 4
