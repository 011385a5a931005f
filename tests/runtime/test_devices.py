"""Device selection (pgc_mpi.job.devices): the pure rules with injected inputs, and the CPU-side wrappers.

No test needs a GPU: plan_device, local_rank_from_env and visible_gpus take everything
as arguments, and select_device's torch query is patched where a GPU count other than this
machine's is wanted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgc_mpi.errors import ConfigError, PgcError
from pgc_mpi.job.devices import (
    DEVICE_CHOICES,
    LOCAL_RANK_VARIABLES,
    DevicePlan,
    LocalRank,
    alloc_kinds_have_cuda,
    cuda_aware_mpi,
    local_rank_from_comm,
    local_rank_from_env,
    plan_device,
    select_device,
    shares_gpu,
    visible_gpus,
)

ROOT = Path(__file__).resolve().parents[2]


def local(rank: int = 0, size: int = 1, source: str = "test") -> LocalRank:
    return LocalRank(rank, size, source)


# ---- plan_device --------------------------------------------------------------------------------


def test_choices():
    assert DEVICE_CHOICES == ("cpu", "cuda", "auto")


@pytest.mark.parametrize("gpus", [0, 1, 4])
def test_cpu_is_cpu_whatever_the_gpus(gpus):
    plan = plan_device("cpu", "worker", local(3, 8), gpus, None)
    assert (plan.kind, plan.index, plan.shared) == ("cpu", None, False)


def test_cpu_never_counts_as_sharing():
    # 8 ranks, 1 GPU they would all share: irrelevant when nobody asked for it
    assert plan_device("cpu", "worker", local(0, 8), 1, None).kind == "cpu"


def test_auto_without_gpus_is_cpu():
    plan = plan_device("auto", "worker", local(1, 2), 0, [])
    assert (plan.kind, plan.index) == ("cpu", None)


def test_auto_with_gpus_is_cuda_at_the_local_rank():
    plan = plan_device("auto", "worker", local(2, 4), 4, ["0", "1", "2", "3"])
    assert (plan.kind, plan.index) == ("cuda", 2)


def test_cuda_one_rank_per_gpu():
    assert [plan_device("cuda", "worker", local(r, 4), 4, None).index for r in range(4)] == [0, 1, 2, 3]


def test_cuda_without_gpu_says_what_to_change():
    with pytest.raises(ConfigError) as err:
        plan_device("cuda", "worker", local(1, 4), 0, None)
    text = str(err.value)
    assert "--device cuda" in text and "no GPU is visible to this rank" in text
    assert "CUDA_VISIBLE_DEVICES unset" in text and "local rank 1 of 4" in text
    assert "--device cpu" in text and "--device auto" in text and "--gpus-per-task=1" in text
    assert "\n" not in text


def test_cuda_without_gpu_shows_the_visible_list():
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES=0,1"):
        plan_device("cuda", "worker", local(), 0, ["0", "1"])
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES hides every device"):
        plan_device("cuda", "worker", local(), 0, [])


def test_cuda_without_gpu_on_a_cpu_only_torch():
    with pytest.raises(ConfigError, match="CPU-only build; install a CUDA build of torch"):
        plan_device("cuda", "worker", local(), 0, None, cuda_build=False)


def test_master_messages_name_master_device():
    with pytest.raises(ConfigError, match="^--master-device cuda: no GPU is visible"):
        plan_device("cuda", "master", local(), 0, None)
    with pytest.raises(ConfigError, match=r"^--master-device 'gpu' is not one of: cpu, cuda, auto$"):
        plan_device("gpu", "master", local(), 2, None)


def test_unknown_request():
    with pytest.raises(ConfigError, match=r"^--device 'x' is not one of: cpu, cuda, auto$"):
        plan_device("x", "worker", local(), 0, None)


def test_unknown_role_is_a_programming_error():
    with pytest.raises(ValueError, match="role 'Worker'") as err:
        plan_device("cpu", "Worker", local(), 0, None)
    assert not isinstance(err.value, PgcError)


def test_negative_gpu_count():
    with pytest.raises(ValueError, match="gpu_count"):
        plan_device("cuda", "worker", local(), -1, None)


def test_round_robin_with_share():
    # local rank 5 of 8 on 4 GPUs: device 5 % 4 = 1, allowed only with --share-gpus
    plan = plan_device("cuda", "worker", local(5, 8), 4, None, share=True)
    assert (plan.kind, plan.index, plan.shared) == ("cuda", 1, True)


def test_round_robin_needs_share():
    with pytest.raises(ConfigError) as err:
        plan_device("cuda", "worker", local(5, 8), 4, None)
    text = str(err.value)
    assert "8 ranks on this node would share 4 GPUs" in text
    assert "--share-gpus" in text and "fewer tasks per node" in text and "--gpus-per-task=1" in text


@pytest.mark.parametrize("rank", range(8))
def test_eight_ranks_on_two_gpus(rank):
    with pytest.raises(ConfigError, match="8 ranks on this node would share 2 GPUs"):
        plan_device("cuda", "worker", local(rank, 8), 2, ["0", "1"])
    assert plan_device("cuda", "worker", local(rank, 8), 2, ["0", "1"], share=True).index == rank % 2


def test_auto_follows_the_same_sharing_rule():
    with pytest.raises(ConfigError, match="^--device auto: 4 ranks on this node would share 2 GPUs"):
        plan_device("auto", "worker", local(0, 4), 2, None)


def test_slurm_per_task_binding_is_not_sharing():
    # --gpus-per-task=1 --gpu-bind: 4 tasks on the node, each sees only its own GPU, as its device 0
    for rank in range(4):
        plan = plan_device("cuda", "worker", local(rank, 4, "SLURM_LOCALID (srun)"), 1, ["GPU-abc"])
        assert (plan.kind, plan.index, plan.shared) == ("cuda", 0, False)


def test_per_task_binding_by_index_and_mig():
    assert plan_device("cuda", "worker", local(3, 4), 1, ["3"]).index == 0
    assert plan_device("cuda", "worker", local(1, 2), 1, ["MIG-4b3c2a1f-0000-1111-2222-333344445555"]).index == 0


def test_single_unbound_gpu_is_shared():
    with pytest.raises(ConfigError) as err:
        plan_device("cuda", "worker", local(1, 4), 1, None)
    text = str(err.value)
    assert "4 ranks on this node would share 1 GPU," in text
    assert "CUDA_VISIBLE_DEVICES unset so every rank sees the same one" in text
    plan = plan_device("cuda", "worker", local(1, 4), 1, None, share=True)
    assert (plan.index, plan.shared) == (0, True)


def test_single_gpu_of_a_longer_list_is_shared():
    # CUDA found one device of "0,7": every rank sees that same device
    with pytest.raises(ConfigError, match="would share 1 GPU"):
        plan_device("cuda", "worker", local(0, 2), 1, ["0", "7"])


def test_one_rank_one_gpu():
    plan = plan_device("cuda", "worker", local(0, 1), 1, None)
    assert (plan.index, plan.shared) == (0, False)


def test_fewer_ranks_than_gpus():
    assert plan_device("cuda", "worker", local(1, 2), 4, None).index == 1


def test_master_counts_as_a_rank_of_the_node():
    # 1 master + 4 workers on a 4-GPU node: 5 ranks, so a worker needs --share-gpus
    with pytest.raises(ConfigError, match="5 ranks on this node would share 4 GPUs"):
        plan_device("cuda", "worker", local(4, 5), 4, None)
    assert plan_device("cpu", "master", local(0, 5), 4, None).kind == "cpu"


def test_shares_gpu_rule():
    assert not shares_gpu(local(0, 4), 4, None)
    assert shares_gpu(local(0, 5), 4, None)
    assert not shares_gpu(local(0, 4), 1, ["GPU-abc"])
    assert shares_gpu(local(0, 4), 1, None)
    assert shares_gpu(local(0, 4), 1, ["0", "1"])
    assert not shares_gpu(local(0, 1), 1, None)
    assert not shares_gpu(local(0, 8), 0, None)


def test_plan_copies_the_visible_list():
    visible = ["0", "1"]
    plan = plan_device("cuda", "worker", local(), 2, visible)
    visible.append("2")
    assert plan.visible == ["0", "1"]


def test_local_rank_validates():
    with pytest.raises(ValueError):
        LocalRank(4, 4, "x")
    with pytest.raises(ValueError):
        LocalRank(0, 0, "x")
    with pytest.raises(ValueError):
        LocalRank(-1, 2, "x")


# ---- describe, to_json, torch_device ------------------------------------------------------------


def test_describe_cuda():
    plan = plan_device("cuda", "worker", local(1, 4, "SLURM_LOCALID (srun)"), 4, ["0", "1", "2", "3"])
    assert plan.describe() == ("worker on cuda:1 (local rank 1 of 4 from SLURM_LOCALID (srun); "
                               "CUDA_VISIBLE_DEVICES=0,1,2,3)")


def test_describe_cpu_and_shared():
    plan = plan_device("cpu", "master", local(0, 1, "single process"), 0, None)
    assert plan.describe() == "master on cpu (local rank 0 of 1 from single process; CUDA_VISIBLE_DEVICES unset)"
    shared = plan_device("cuda", "worker", local(2, 3), 1, None, share=True)
    assert shared.describe().startswith("worker on cuda:0 shared with other ranks (--share-gpus) (local rank 2 of 3")


def test_to_json():
    plan = plan_device("cuda", "worker", local(5, 8, "MPI shared-memory split"), 4, ["0", "1", "2", "3"], share=True)
    data = plan.to_json()
    assert data == {
        "role": "worker",
        "device": "cuda:1",
        "kind": "cuda",
        "index": 1,
        "shared": True,
        "local_rank": 5,
        "local_size": 8,
        "local_source": "MPI shared-memory split",
        "cuda_visible_devices": ["0", "1", "2", "3"],
    }
    assert json.loads(json.dumps(data)) == data
    cpu = plan_device("cpu", "master", local(), 0, None).to_json()
    assert (cpu["device"], cpu["index"], cpu["cuda_visible_devices"]) == ("cpu", None, None)


def test_torch_device():
    torch = pytest.importorskip("torch")
    assert plan_device("cpu", "worker", local(), 0, None).torch_device() == torch.device("cpu")
    cuda = DevicePlan("cuda", 3, local(), None, "worker").torch_device()  # a device object needs no GPU
    assert (cuda.type, cuda.index) == ("cuda", 3)


# ---- local_rank_from_env ------------------------------------------------------------------------

LAUNCHER_ENVS = [
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, "OMPI_COMM_WORLD_LOCAL_RANK (Open MPI)"),
    ({"MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}, "MPI_LOCALRANKID (MPICH Hydra)"),
    ({"PMI_LOCAL_RANK": "2", "PMI_LOCAL_SIZE": "4"}, "PMI_LOCAL_RANK (PMI)"),
    ({"SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "4"}, "SLURM_LOCALID (srun)"),
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}, "LOCAL_RANK (torchrun)"),
]


@pytest.mark.parametrize("env,source", LAUNCHER_ENVS, ids=[s.split()[0] for _, s in LAUNCHER_ENVS])
def test_each_launcher(env, source):
    assert local_rank_from_env(env) == LocalRank(2, 4, source)


def test_every_launcher_is_tested():
    assert [rank_var for rank_var, _, _ in LOCAL_RANK_VARIABLES] == [next(iter(e)) for e, _ in LAUNCHER_ENVS]


def test_no_launcher():
    assert local_rank_from_env({}) is None
    assert local_rank_from_env({"PATH": "/bin", "SLURM_JOB_ID": "7"}) is None


def test_priority_mpi_launcher_over_inherited_slurm():
    # mpiexec inside an allocation: the ranks inherit the per-node daemon's SLURM_LOCALID=0
    env = {"SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "4", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4",
           "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert local_rank_from_env(env) == LocalRank(3, 4, "MPI_LOCALRANKID (MPICH Hydra)")
    env.update({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert local_rank_from_env(env).source == "OMPI_COMM_WORLD_LOCAL_RANK (Open MPI)"


def test_priority_slurm_over_torchrun():
    env = {"SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    assert local_rank_from_env(env) == LocalRank(1, 2, "SLURM_LOCALID (srun)")


def test_half_a_pair_is_skipped():
    # srun without --ntasks-per-node: no local size from Slurm, so the next launcher's pair (or None)
    assert local_rank_from_env({"SLURM_LOCALID": "3"}) is None
    assert local_rank_from_env({"SLURM_LOCALID": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}).rank == 1
    assert local_rank_from_env({"OMPI_COMM_WORLD_LOCAL_RANK": "x"}) is None  # not parsed: not this launcher's


def test_whitespace_is_accepted():
    found = local_rank_from_env({"PMI_LOCAL_RANK": " 1 ", "PMI_LOCAL_SIZE": "2\n"})
    assert found == LocalRank(1, 2, "PMI_LOCAL_RANK (PMI)")


@pytest.mark.parametrize("name,value", [("OMPI_COMM_WORLD_LOCAL_RANK", "one"), ("OMPI_COMM_WORLD_LOCAL_SIZE", ""),
                                        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4(x2)")])
def test_malformed_variable(name, value):
    env = {"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4", name: value}
    with pytest.raises(ConfigError) as err:
        local_rank_from_env(env)
    assert f"{name}={value!r} is not an integer" in str(err.value)


@pytest.mark.parametrize("rank,size", [("4", "4"), ("-1", "4"), ("0", "0")])
def test_rank_out_of_range(rank, size):
    with pytest.raises(ConfigError, match=f"LOCAL_RANK={rank} and LOCAL_WORLD_SIZE={size} .*torchrun"):
        local_rank_from_env({"LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": size})


# ---- local_rank_from_comm -----------------------------------------------------------------------


def test_local_rank_from_comm_self():
    from mpi4py import MPI

    assert local_rank_from_comm(MPI.COMM_SELF) == LocalRank(0, 1, SPLIT)


SPLIT = "MPI shared-memory split"


class FakeNode:
    def __init__(self, rank, size, wants=None):
        self.rank, self.size, self.freed = rank, size, 0
        self.wants = [True] * size if wants is None else wants

    def allgather(self, value):
        return list(self.wants)

    def Get_rank(self):  # noqa: N802 (mpi4py's names)
        return self.rank

    def Get_size(self):  # noqa: N802 (mpi4py's names)
        return self.size

    def Free(self):  # noqa: N802 (mpi4py's names)
        self.freed += 1


class FakeComm:
    def __init__(self, node):
        self.node, self.calls = node, []

    def Get_rank(self):  # noqa: N802 (mpi4py's names)
        return 9

    def Split_type(self, split_type, key=0):  # noqa: N802 (mpi4py's names)
        self.calls.append((split_type, key))
        return self.node


def test_local_rank_from_comm_splits_by_shared_memory_and_frees():
    from mpi4py import MPI

    comm = FakeComm(FakeNode(2, 3))
    assert local_rank_from_comm(comm) == LocalRank(2, 3, SPLIT)
    assert comm.calls == [(MPI.COMM_TYPE_SHARED, 9)] and comm.node.freed == 1


def test_a_cpu_master_on_the_node_takes_no_gpu_slot():
    # world order on the node: the master (cpu), then three workers that want a GPU
    assert local_rank_from_comm(FakeComm(FakeNode(1, 4, [False, True, True, True]))) == LocalRank(0, 3, SPLIT)
    assert local_rank_from_comm(FakeComm(FakeNode(3, 4, [False, True, True, True]))) == LocalRank(2, 3, SPLIT)
    assert local_rank_from_comm(FakeComm(FakeNode(0, 4, [False, True, True, True])), wants_gpu=False) == \
        LocalRank(0, 4, SPLIT)


def test_local_rank_from_comm_frees_on_error():
    comm = FakeComm(FakeNode(3, 3, [False] * 3))  # an impossible rank: LocalRank refuses it
    with pytest.raises(ValueError):
        local_rank_from_comm(comm, wants_gpu=False)
    assert comm.node.freed == 1


# ---- visible_gpus -------------------------------------------------------------------------------


@pytest.mark.parametrize("raw,expected", [
    (None, None),
    ("", []),
    ("  ", []),
    ("-1", []),
    ("NoDevFiles", []),
    ("0", ["0"]),
    ("0,1,2,3", ["0", "1", "2", "3"]),
    (" 2 , 3 ", ["2", "3"]),
    ("0,1,", ["0", "1"]),
    ("0,-1,2", ["0"]),
    ("1,,2", ["1"]),
    ("GPU-8e2b7a5c-1d3f-4e6a-9b0c-112233445566", ["GPU-8e2b7a5c-1d3f-4e6a-9b0c-112233445566"]),
    ("MIG-GPU-8e2b7a5c/1/0,MIG-4b3c2a1f", ["MIG-GPU-8e2b7a5c/1/0", "MIG-4b3c2a1f"]),
])
def test_visible_gpus(raw, expected):
    env = {} if raw is None else {"CUDA_VISIBLE_DEVICES": raw}
    assert visible_gpus(env) == expected


# ---- select_device ------------------------------------------------------------------------------


def test_select_cpu_does_not_import_torch_or_mpi4py():
    code = ("import sys; from pgc_mpi.job.devices import select_device; plan = select_device('cpu', 'worker'); "
            "assert plan.kind == 'cpu'; assert 'torch' not in sys.modules, 'torch'; "
            "assert 'mpi4py' not in sys.modules, 'mpi4py'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_select_cpu_in_process():
    plan = select_device("cpu", "master", env={"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3"})
    assert (plan.kind, plan.local, plan.role) == ("cpu", LocalRank(1, 3, "LOCAL_RANK (torchrun)"), "master")
    assert select_device("cpu", "worker", env={}).local == LocalRank(0, 1, "single process")


def test_select_cuda_without_gpu_raises():
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="^--device cuda: no GPU is visible to this rank"):
        select_device("cuda", "worker", env={})
    assert select_device("auto", "worker", env={}).kind == "cpu"


def test_select_with_comm_uses_the_split():
    from mpi4py import MPI

    plan = select_device("cpu", "worker", comm=MPI.COMM_SELF, env={"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3"})
    assert plan.local == LocalRank(0, 1, "MPI shared-memory split")


def test_select_splits_before_validating():
    # a bad flag on one rank must not leave the others waiting in the collective
    comm = FakeComm(FakeNode(0, 2))
    with pytest.raises(ConfigError, match="^--master-device 'gpu'"):
        select_device("gpu", "master", comm=comm, env={})
    assert len(comm.calls) == 1 and comm.node.freed == 1


def test_select_cuda_with_patched_gpus(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    env = {"OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    plan = select_device("cuda", "worker", env=env)
    assert (plan.kind, plan.index, plan.visible) == ("cuda", 3, ["4", "5", "6", "7"])
    env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "6"
    with pytest.raises(ConfigError, match="6 ranks on this node would share 4 GPUs"):
        select_device("cuda", "worker", env=env)
    assert select_device("cuda", "worker", env=env, share=True).shared


def test_select_names_a_cpu_only_torch(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    with pytest.raises(ConfigError, match="CPU-only build"):
        select_device("cuda", "worker", env={})
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    with pytest.raises(ConfigError, match="torch sees 0 devices"):
        select_device("cuda", "worker", env={})


# ---- cuda_aware_mpi -----------------------------------------------------------------------------


def test_cuda_aware_mpi_answers_a_bool():
    assert isinstance(cuda_aware_mpi(), bool)


def test_cuda_aware_mpi_never_raises(monkeypatch):
    from mpi4py import MPI

    def broken():
        raise RuntimeError("no")

    monkeypatch.setattr(MPI, "Query_cuda_support", broken, raising=False)
    assert cuda_aware_mpi() is False
    monkeypatch.setattr(MPI, "Query_cuda_support", lambda: 1, raising=False)
    assert cuda_aware_mpi() is True


@pytest.mark.parametrize("kinds,expected", [
    (None, False), ("", False), ("mpi,system", False), ("mpi,system,cuda:device", True), ("cuda", True),
    ("mpi, CUDA:host", True), ("mpi,rocm:device", False), ("mpi,cudax", False),
])
def test_alloc_kinds_have_cuda(kinds, expected):
    assert alloc_kinds_have_cuda(kinds) is expected


def test_environment_is_not_touched():
    before = dict(os.environ)
    select_device("cpu", "worker")
    assert dict(os.environ) == before


# ---- the staged path of a torch model (what a GPU runs), on the CPU ------------------------------


@pytest.mark.parametrize("model", ["logreg", "cnn"])
def test_the_staged_path_computes_what_the_direct_one_does(model):
    import numpy as np

    from pgc_mpi.learning.datasets import load_digits
    from pgc_mpi.learning.torch_problem import TorchProblem

    direct = TorchProblem(model, load_digits(3), 4, 16, seed=3, dtype="float64")
    staged = TorchProblem(model, load_digits(3), 4, 16, seed=3, dtype="float64", staged=True)
    assert not np.shares_memory(staged.flat.values, staged.flat.flat.numpy())  # it goes through the mirrors
    w = direct.initial_params() + 0.01
    assert np.array_equal(staged.initial_params(), direct.initial_params())
    for partition, draw in ((0, 0), (3, 5)):
        loss_d, grad_d = direct.loss_and_grad(w, partition, draw)
        loss_s, grad_s = staged.loss_and_grad(w, partition, draw)
        assert loss_s == loss_d and np.array_equal(grad_s, grad_d)
    assert staged.evaluate(w) == direct.evaluate(w)
    assert np.array_equal(staged.probe_grad(w), direct.probe_grad(w))
