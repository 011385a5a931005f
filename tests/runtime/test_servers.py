"""--servers K without MPI: the shards, the optimizer state cut and put together, the configuration's checks,
and pbs's orders, diagnostics and table as the servers share them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pgc_mpi.config import TrainConfig
from pgc_mpi.core.shards import shard_bounds
from pgc_mpi.core.table import PartitionTable
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.diagnostics import TableDiagnostics
from pgc_mpi.learning.optim import FlatOptimizer
from pgc_mpi.learning.problems import LeastSquares
from pgc_mpi.runtime.servers import (
    ANSWER,
    ARRIVAL,
    COMMIT,
    DECODE,
    END,
    GATHER_STATE,
    FollowerControl,
    Leader,
    bits_float,
    float_bits,
    merge_states,
    slice_state,
)
from pgc_mpi.runtime.tags import TAG_TABLE


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


def test_ddp_refuses_servers_and_pbs_takes_them():
    with pytest.raises(ConfigError, match=r"^--servers 2: --scheme ddp has no parameter server"):
        TrainConfig(scheme="ddp", servers=2).validate(4)
    TrainConfig(scheme="pbs", servers=3).validate(4)  # rank 0 orders the arrivals for all (pgc_mpi.runtime.servers)


class FakeFollowerLink:
    """A FollowerLink without MPI: the orders given, and what the follower sent back."""

    poll_interval = 1e-4

    def __init__(self, orders):
        self.pending, self.sent = list(orders), []

    def orders(self):
        got, self.pending = self.pending, []
        return got

    def send_shard(self, params, state=None, table=None):
        self.sent.append(("shard", params.copy(), state, None if table is None else table.copy()))

    def send_diagnosis(self, sums, now=None, old=None):
        self.sent.append(("diagnosis", sums, now, old))


def test_a_pbs_follower_carries_out_rank_0_s_events_in_order_and_steps_with_its_learning_rate():
    link = FakeFollowerLink([(ARRIVAL, 0, 2, 1), (ANSWER, 0, 1, 0), (ARRIVAL, 0, 1, 0), (DECODE, 0, 0, -1),
                             (COMMIT, 0, -1, float_bits(0.125)), (GATHER_STATE, 1, -1, 0), (ANSWER, 1, 2, 0)])
    control = FollowerControl(link, follows_arrivals=True)
    w = np.arange(3.0)
    opt = FlatOptimizer(w, "sgd", 0.5)
    table = np.ones((4, 3))
    control.attach(w, opt.opt, 0, table)
    events = [control.next_event(0) for _ in range(4)]
    assert events == [(ARRIVAL, 0, 2, 1), (ANSWER, 0, 1, 0), (ARRIVAL, 0, 1, 0), (DECODE, 0, 0, -1)]
    assert control.may_update(0, 0.5) and opt.opt.param_groups[0]["lr"] == 0.125  # rank 0's, exactly
    assert not control.after_step(0, 1.0)
    assert link.sent == []  # the gather is answered in its place among the events
    assert control.next_event(1) == (ANSWER, 1, 2, 0)
    kind, params, state, sent_table = link.sent[0]
    assert kind == "shard" and state is not None and np.array_equal(sent_table, table)
    link.pending.append((END, 1, -1, 0))
    assert control.next_event(1) is None and control.ended == 1
    assert bits_float(float_bits(0.1)) == 0.1


class FakeLeaderLink:
    """A LeaderLink without MPI whose followers are TableDiagnostics of their shards in this process."""

    def __init__(self, followers: list[tuple[TableDiagnostics, PartitionTable, np.ndarray]]):
        self.followers = range(1, len(followers) + 1)
        self.servers, self.orders = followers, []

    def order(self, kind, steps, worker=-1, value=0):
        self.orders.append((kind, steps, worker, value))

    def receive_diagnoses(self, sums, nows=None, olds=None):
        _, step, _, probe = self.orders[-1]
        for j, (diag, table, grad) in enumerate(self.servers):
            got_sums, now, old = diag.report(step, table, grad, probe if probe >= 0 else None)
            sums[j] = got_sums
            if nows is not None:
                nows[j][...], olds[j][...] = now, old


@pytest.mark.parametrize("adapt", [False, True])
def test_pbs_diagnostics_over_shards_are_the_whole_vector_s(adapt):
    """Rank 0 adds the followers' sums to its own and probes the whole models put together: the
    same numbers as one server's, and --adapt's learning rate is the same."""
    problem = LeastSquares(3, samples=120, dim=7, seed=1)
    rng = np.random.default_rng(4)
    shards = shard_bounds(7, 3)
    whole = TableDiagnostics(problem, probe_every=2, horizon=2, adapt=adapt)
    followers = [(TableDiagnostics(None, 2, 2), PartitionTable(3, 3, 7), np.zeros(s.stop - s.start))
                 for s in shards[1:]]
    link = FakeLeaderLink(followers)
    lead = TableDiagnostics(problem, probe_every=2, horizon=2, adapt=adapt, peers=Leader(link, shards))
    table = PartitionTable(3, 3, 7)
    opts = [FlatOptimizer(np.zeros(7), lr=0.8), FlatOptimizer(np.zeros(7), lr=0.8)]
    for t in range(6):
        w = rng.normal(size=7) * (t + 1)
        grad = rng.normal(size=7) * 1e-3
        table.offer(t % 3, t, np.zeros(7))
        whole.remember(t, w)
        lead.remember(t, w[shards[0]])
        for (diag, _, g), shard in zip(followers, shards[1:], strict=True):
            diag.remember(t, w[shard])
            g[...] = grad[shard]
        for _, follower_table, _ in followers:
            follower_table.versions[...] = table.versions
        expected = whole.observe(t, table, grad, opts[0])
        got = lead.observe(t, table, grad[shards[0]], opts[1])
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-12, nan_ok=True), (t, key)
        assert opts[1].opt.param_groups[0]["lr"] == opts[0].opt.param_groups[0]["lr"]
    assert [o[1] for o in link.orders if o[0] == DECODE] == list(range(6))
    probes = [o[3] for o in link.orders if o[0] == DECODE]  # steps 1, 3, 5 probe an old model
    assert probes[0::2] == [-1] * 3 and min(probes[1::2]) >= 0
    assert (not adapt) or opts[0].opt.param_groups[0]["lr"] < 0.8


def test_a_checkpoint_gathers_the_followers_columns_of_the_pbs_table():
    shards = shard_bounds(5, 2)

    class Link:
        followers = range(1, 2)

        def order(self, kind, steps, worker=-1, value=0):
            self.last = (kind, steps)

        def receive_shards(self, parts, tag=None):
            for part in parts:
                part[...] = 7.0 if tag == TAG_TABLE else 3.0

        def receive_states(self):
            return [{"state": {}, "param_groups": [{"lr": 0.1}]}]

    link = Link()
    w, table = np.zeros(5), np.zeros((4, 5))
    merged = Leader(link, shards).gather(w, 9, {"state": {}, "param_groups": [{"lr": 0.1}]}, table)
    assert link.last == (GATHER_STATE, 9) and merged["param_groups"] == [{"lr": 0.1}]
    assert (w[shards[1]] == 3.0).all() and (table[:, shards[1]] == 7.0).all() and (table[:, shards[0]] == 0).all()


def test_servers_must_leave_a_worker_and_be_positive():
    cfg = TrainConfig(servers=3)
    with pytest.raises(ConfigError, match=r"--servers 3 needs at least 4 MPI ranks \(ranks 0\.\.2 are the servers"):
        cfg.validate(cfg.workers_of(3))
    with pytest.raises(ConfigError, match=r"--servers must be a positive integer"):
        TrainConfig(servers=0).validate(4)
    assert TrainConfig(servers=3).workers_of(7) == 4
