"""The memory estimate (pgc_mpi.config.memory): what each rank allocates, by role."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgc_mpi.config import TrainConfig, config_from_args
from pgc_mpi.config.memory import MiB, rank_need, synthetic_size, torch_size
from pgc_mpi.job.checks import available_memory
from pgc_mpi.runs.run_folder import MAY_CHANGE_ON_RESUME

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


def test_a_workers_loaders_hold_the_minibatches_of_the_jobs_ahead():
    lazy = torch_size(1000, (1, 28, 28), 60000, 10000, n=6, held=False, eval_train=True, batch_size=64)
    assert lazy.minibatch_bytes == (4 * 784 + 8) * 64
    assert torch_size(1000, (1, 28, 28), 60000, 10000, n=6, held=True, eval_train=True).minibatch_bytes == 0

    def worker(**options):
        cfg = TrainConfig(scheme="gc-cr", stragglers=1, **options)
        return dict(rank_need(cfg, cfg.make_scheme(6), lazy, 1).parts)

    ahead = worker(prefetch=3, accumulate=2)["minibatches of 4 jobs loaded ahead"]
    assert ahead == 4 * 2 * 2 * lazy.minibatch_bytes  # 4 jobs of c = 2 gradients of 2 micro-batches
    assert "minibatches of 3 jobs loaded ahead" not in worker(loader_workers=0)
    assert "minibatches of 3 jobs loaded ahead" in worker()  # auto: loaders for a Dataset


def test_the_check_can_be_turned_off_and_is_no_part_of_a_runs_identity():
    assert config_from_args(["--no-memory-check"]).memory_check is False
    assert config_from_args([]).memory_check is True
    assert "memory_check" in MAY_CHANGE_ON_RESUME


def test_available_memory_is_what_the_node_has_at_most():
    available, source = available_memory()
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    total = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1]) * 1024
    assert 0 < available <= total and source


def _fake_node(tmp_path, membership: str, files: dict[str, str]):
    """A /proc (MemAvailable 40 GiB; this process in cgroup `membership`) and a cgroup tree."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {64 << 20} kB\nMemAvailable: {40 << 20} kB\n")
    (proc / "self" / "cgroup").write_text(membership)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return proc, root


GiB = 1 << 30


def test_a_cgroups_inactive_file_cache_counts_as_available_v2(tmp_path):
    job = "slurm/job_1"
    proc, root = _fake_node(tmp_path, "0::/slurm/job_1/step_0\n", {
        f"{job}/memory.max": f"{8 * GiB}\n", f"{job}/memory.current": f"{7 * GiB}\n",
        # a data file just read: 5 GiB of its 6 GiB of cache is inactive, which the kernel reclaims first
        f"{job}/memory.stat": f"anon {GiB}\nfile {6 * GiB}\nactive_file {GiB}\ninactive_file {5 * GiB}\n",
        f"{job}/step_0/memory.max": "max\n", f"{job}/step_0/memory.current": f"{7 * GiB}\n"})
    available, source = available_memory(proc, root)
    assert available == 6 * GiB and source.startswith(f"cgroup {root / job}: limit 8.0 GiB, 2.0 GiB used")
    (root / job / "memory.stat").write_text(f"inactive_file {9 * GiB}\n")  # never more than the limit
    assert available_memory(proc, root)[0] == 8 * GiB
    (root / job / "memory.max").write_text("max\n")  # no limit: the node's MemAvailable
    assert available_memory(proc, root) == (40 * GiB, "MemAvailable")


def test_a_cgroups_inactive_file_cache_counts_as_available_v1(tmp_path):
    job = "memory/slurm/uid_0/job_2"
    proc, root = _fake_node(tmp_path, "12:memory:/slurm/uid_0/job_2\n4:cpu,cpuacct:/slurm/uid_0/job_2\n", {
        "memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": f"{30 * GiB}\n",
        f"{job}/memory.limit_in_bytes": f"{4 * GiB}\n", f"{job}/memory.usage_in_bytes": f"{3 * GiB}\n",
        # v1's usage counts the cgroups below: so does total_inactive_file, not inactive_file
        f"{job}/memory.stat": f"cache {2 * GiB}\ninactive_file 4096\ntotal_inactive_file {2 * GiB}\n"})
    available, source = available_memory(proc, root)
    assert available == 3 * GiB and source.startswith(f"cgroup {root / job}: limit 4.0 GiB, 1.0 GiB used")
    (root / job / "memory.stat").unlink()  # no memory.stat: all of the usage counts
    assert available_memory(proc, root)[0] == GiB


def test_a_gpu_workers_model_and_data_are_not_host_memory():
    cfg = TrainConfig()
    scheme = cfg.make_scheme(3)
    size = torch_size(D, (1, 28, 28), 60000, 10000, n=3, held=True, eval_train=True)
    cpu, gpu = rank_need(cfg, scheme, size, 1), rank_need(cfg, scheme, size, 1, gpu=True)
    stored = len(scheme.placement[0])
    assert stored > 1
    # torch's parameters, .grad and flat gradient (3*D*4) go to the GPU, its page-locked mirrors (2*D*4)
    # stay; its partitions go to the GPU one at a time
    assert cpu.total - gpu.total == pytest.approx(D * 4 + (stored - 1) * size.partition_bytes)
    assert dict(gpu.parts)["page-locked mirrors of the GPU's parameters and gradient"] == 2 * D * 4
    assert rank_need(cfg, scheme, size, 0, gpu=True) == rank_need(cfg, scheme, size, 0)  # the master's are NumPy
