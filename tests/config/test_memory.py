"""The memory estimate (pgc_mpi.config.memory): what each rank allocates, by role."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgc_mpi.config import TrainConfig, config_from_args
from pgc_mpi.config.memory import MiB, rank_need, synthetic_size, torch_size
from pgc_mpi.runs.run_folder import MAY_CHANGE_ON_RESUME
from pgc_mpi.runtime.checks import available_memory

D = 10_000_000


def _need(rank, **options):
    cfg = TrainConfig(problem="quadratic", dim=D, **options)
    return rank_need(cfg, cfg.make_scheme(3), synthetic_size(cfg), rank)


def test_the_estimate_by_role_counts_vectors_of_the_model():
    vector = 4 * D  # float32
    master, worker = _need(0), _need(1)
    assert master.role == "master" and worker.role == "worker"
    # master: 3 receive rows + parameters, gradient + 2 send buffers + torch's optimizer; worker:
    # c=2 buffers, the fresh gradient and 2 message buffers (measured: docs/reliability.md)
    assert master.total == pytest.approx(7 * vector + 65 * MiB)
    assert worker.total == pytest.approx(5 * vector + MiB)
    assert _need(0, optimizer="adam").total == pytest.approx(master.total + 2 * vector)
    assert _need(1, wire_dtype="bfloat16").total == pytest.approx(3 * vector + 2 * 2 * D + 3 * vector + MiB)
    assert _need(0, record_params=True, steps=9).total == pytest.approx(master.total + 10 * vector)
    shard = _need(1, servers=2)
    assert shard.role == "server" and shard.total == pytest.approx(9 * vector / 2 + 65 * MiB)
    assert _need(0, servers=2).total == pytest.approx(7 * vector / 2 + vector + vector + 65 * MiB)
    assert _need(0, scheme="pbs").total == pytest.approx(master.total + 3 * vector)  # its table
    assert "3 receive rows" in master.describe() and "GiB" not in master.describe()


def test_rank_0s_built_problem_is_not_counted_again():
    cfg = TrainConfig(problem="least-squares", dim=1000, samples=5000)
    size = synthetic_size(cfg)
    assert size.whole_bytes == 5000 * 1001 * 8
    scheme = cfg.make_scheme(3)
    assert rank_need(cfg, scheme, size, 0).total - rank_need(cfg, scheme, size, 0, built=True).total == \
        size.whole_bytes


def test_torch_workers_hold_their_partitions_rows_unless_read_lazily():
    held = torch_size(1000, (1, 28, 28), 60000, 10000, n=6, held=True, eval_train=True)
    assert held.partition_bytes == pytest.approx((4 * 784 + 8) * 10000)
    assert torch_size(1000, (1, 28, 28), 60000, 10000, n=6, held=False, eval_train=True).partition_bytes == 0


def test_the_check_can_be_turned_off_and_is_no_part_of_a_runs_identity():
    assert config_from_args(["--no-memory-check"]).memory_check is False
    assert config_from_args([]).memory_check is True
    assert "memory_check" in MAY_CHANGE_ON_RESUME


def test_available_memory_is_what_the_node_has_at_most():
    available, source = available_memory()
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    total = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1]) * 1024
    assert 0 < available <= total and source
