"""Which device each rank computes on: `--device cpu|cuda|auto` (workers), `--master-device` (rank 0).

A rank's GPU follows from its rank within its node (the local rank) and the GPUs it can see. The
decision itself is plan_device, a pure function of those inputs, so every rule here is tested on
machines without a GPU; select_device is the thin impure wrapper that gathers the inputs (the MPI
shared-memory split or the launcher's variables, CUDA_VISIBLE_DEVICES, torch's device count).

This module imports neither torch nor mpi4py at import time: a CPU run, `--help` and a
configuration error never pay for torch's import, and only the functions that need one of them
import it (select_device imports torch only for a request other than cpu).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..choices import DEVICE_CHOICES
from ..errors import ConfigError

ROLES = ("master", "worker")

# (rank variable, size variable, launcher) for the node-local rank, highest priority first. The MPI
# launchers' own variables come before Slurm's: `mpirun`/`mpiexec` inside a Slurm allocation start
# one daemon per node with srun, and every rank inherits that daemon's SLURM_LOCALID (0 on every
# node), which would put all of a node's ranks on GPU 0. Under a direct `srun` launch the MPI ones
# are absent (or agree), so Slurm's are used. SLURM_LOCALID has no per-node size beside it that is
# simple to read (SLURM_TASKS_PER_NODE is a compressed list like "4(x2),3" of the whole step), so
# Slurm counts only when SLURM_NTASKS_PER_NODE is set (--ntasks-per-node); otherwise the MPI split
# (local_rank_from_comm) is the one to trust. torchrun's generic names come last: other tools set
# a LOCAL_RANK of their own.
LOCAL_RANK_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI"),
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MPICH Hydra"),
    ("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", "PMI"),
    ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "srun"),
    ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun"),
)

SPLIT_SOURCE = "MPI shared-memory split"  # among the node's ranks that want a GPU
SINGLE_SOURCE = "single process"

# CUDA_VISIBLE_DEVICES entries that end the list (CUDA ignores them and every entry after them):
# Slurm and Grid Engine set NoDevFiles when a job has no GPUs; -1 (any negative index) is the
# usual way to hide every device.
_NO_DEVICE = "NoDevFiles"


@dataclass(frozen=True)
class LocalRank:
    """This process's rank among the ranks on its node (`rank` of `size`), and where that came from."""

    rank: int
    size: int
    source: str

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"local rank {self.rank} of {self.size} ({self.source}): need 0 <= rank < size")


@dataclass(frozen=True)
class DevicePlan:
    """Where one rank computes: `kind` "cpu" or "cuda", `index` the CUDA device (an index into the
    devices this process sees, i.e. after CUDA_VISIBLE_DEVICES; None on cpu), the local rank and the
    visible list it was chosen from, the rank's role ("master" or "worker"), and whether other ranks
    on the node may use the same GPU (`shared`: only ever True when --share-gpus allowed it)."""

    kind: str
    index: int | None
    local: LocalRank
    visible: list[str] | None
    role: str
    shared: bool = False

    @property
    def name(self) -> str:
        """The device as torch spells it: cpu or cuda:N."""
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    def torch_device(self) -> Any:
        """The torch.device of this plan (imports torch)."""
        import torch

        return torch.device("cpu") if self.kind == "cpu" else torch.device("cuda", self.index)

    def describe(self) -> str:
        """One line for the log, e.g. "worker on cuda:1 (local rank 1 of 4 from SLURM_LOCALID (srun);
        CUDA_VISIBLE_DEVICES=0,1,2,3)"."""
        shared = " shared with other ranks (--share-gpus)" if self.shared else ""
        return (f"{self.role} on {self.name}{shared} (local rank {self.local.rank} of {self.local.size} from "
                f"{self.local.source}; {_show_visible(self.visible)})")

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON-ready values, for the run's provenance (config.json)."""
        return {
            "role": self.role,
            "device": self.name,
            "kind": self.kind,
            "index": self.index,
            "shared": self.shared,
            "local_rank": self.local.rank,
            "local_size": self.local.size,
            "local_source": self.local.source,
            "cuda_visible_devices": None if self.visible is None else list(self.visible),
        }


def local_rank_from_env(env: Mapping[str, str]) -> LocalRank | None:
    """The node-local rank the launcher set in `env`: the first entry of LOCAL_RANK_VARIABLES whose
    two variables are both present (None when no launcher's are). A value that is not an integer,
    or a rank outside [0, size), is a ConfigError naming the variables."""
    for rank_var, size_var, launcher in LOCAL_RANK_VARIABLES:
        if rank_var not in env or size_var not in env:
            continue  # a lone variable of a pair is not this launcher's doing (or not enough to use)
        rank, size = _env_int(env, rank_var), _env_int(env, size_var)
        if size < 1 or not 0 <= rank < size:
            raise ConfigError(f"{rank_var}={rank} and {size_var}={size} (set by {launcher}) are not a local rank in "
                              f"[0, size): check the launcher's environment, or unset them")
        return LocalRank(rank, size, f"{rank_var} ({launcher})")
    return None


def _env_int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer: it should be the node-local rank or size that "
                          f"the launcher sets; unset it or fix it") from None


def local_rank_from_comm(comm: Any, wants_gpu: bool = True) -> LocalRank:
    """This rank's rank and size among the ranks of its node that want a GPU (`wants_gpu`: every
    rank says whether it does), from comm.Split_type(MPI.COMM_TYPE_SHARED): a CPU master beside
    four GPU workers leaves the node's four GPUs to the workers, one each. A rank that wants no
    GPU gets its rank among all the node's ranks.

    A collective: every rank of `comm` must call it, in the same order relative to other collectives.
    MPICH's blocking collectives spin, so callers at start-up may want transport.wait_for_all first
    (ranks that arrive early would otherwise take cores from the ranks still importing)."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())  # key keeps the world order
    try:
        wants = node.allgather(bool(wants_gpu))
        rank = node.Get_rank()
        if wants_gpu:
            return LocalRank(sum(wants[:rank]), sum(wants), SPLIT_SOURCE)
        return LocalRank(rank, node.Get_size(), SPLIT_SOURCE)
    finally:
        node.Free()


def visible_gpus(env: Mapping[str, str]) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES from `env` as a list of its entries (indices, GPU-<uuid> or MIG ids, kept
    as strings): None when it is unset, [] when it hides every device ("", "-1", "NoDevFiles").

    As CUDA does, the list ends at the first empty entry, negative index or NoDevFiles: "0,-1,2"
    makes only device 0 visible. Other entries are kept as they are (CUDA's own check of UUIDs and
    MIG ids is not repeated here)."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    devices: list[str] = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry or entry == _NO_DEVICE or _is_negative_int(entry):
            break
        devices.append(entry)
    return devices


def _is_negative_int(text: str) -> bool:
    try:
        return int(text) < 0
    except ValueError:
        return False


def _flag(role: str) -> str:
    return "--master-device" if role == "master" else "--device"


def _check_request(requested: str, role: str) -> None:
    if role not in ROLES:  # a caller's mistake, not the user's
        raise ValueError(f"role {role!r} is not one of: {', '.join(ROLES)}")
    if requested not in DEVICE_CHOICES:
        raise ConfigError(f"{_flag(role)} {requested!r} is not one of: {', '.join(DEVICE_CHOICES)}")


def _show_visible(visible: list[str] | None) -> str:
    if visible is None:
        return "CUDA_VISIBLE_DEVICES unset"
    return f"CUDA_VISIBLE_DEVICES={','.join(visible)}" if visible else "CUDA_VISIBLE_DEVICES hides every device"


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def shares_gpu(local: LocalRank, gpu_count: int, visible: list[str] | None) -> bool:
    """Whether ranks on this node would compute on the same GPU (plan_device's sharing rule).

    - gpu_count > 1: every rank of the node is taken to see the same gpu_count devices, so they
      share when local.size > gpu_count (rank r takes device r % gpu_count).
    - gpu_count == 1 and local.size > 1: a CUDA_VISIBLE_DEVICES of exactly one entry is taken to be
      a per-rank binding (Slurm --gpus-per-task=1 with --gpu-bind, or a wrapper setting it from the
      local rank): each rank has a device of its own, no sharing. Otherwise (unset, or several
      entries of which CUDA found one) every rank sees the same single GPU: they share.
    - otherwise (one rank on the node, or no GPU): no sharing.

    What one rank's inputs cannot tell: a single-entry CUDA_VISIBLE_DEVICES exported to every rank
    alike (they share, unseen here); and per-task bindings of several GPUs each (--gpus-per-task=2:
    reported as sharing when local.size > 2, though no device is shared; --share-gpus lets it run).
    """
    if gpu_count > 1:
        return local.size > gpu_count
    if gpu_count == 1 and local.size > 1:
        return visible is None or len(visible) != 1
    return False


def plan_device(requested: str, role: str, local: LocalRank, gpu_count: int, visible: list[str] | None,
                share: bool = False, *, cuda_build: bool = True) -> DevicePlan:
    """The device of one rank (pure): `requested` is its --device (--master-device for the master),
    `local` its node-local rank, `gpu_count` the CUDA devices it sees (torch.cuda.device_count()),
    `visible` its CUDA_VISIBLE_DEVICES (visible_gpus), `share` whether --share-gpus was given, and
    `cuda_build` False when torch was built without CUDA (the no-GPU error then says so).

    - "cpu" is cpu; "auto" is cuda when gpu_count > 0, else cpu; "cuda" with no GPU is a ConfigError.
    - A cuda rank takes device local.rank % gpu_count, and device 0 when it sees a single GPU (under
      Slurm's --gpus-per-task=1 binding each task's own GPU is its device 0).
    - Sharing (shares_gpu: more ranks on the node than GPUs they see, or several ranks that all
      see the same single GPU) is a ConfigError unless `share`.

    `local` counts the node's ranks that want a GPU (local_rank_from_comm), so a CPU master takes
    no device from the workers; from the launchers' variables (no communicator) it counts every
    rank of the node. The rule is the same for both roles: the role only names the flag in messages.
    """
    _check_request(requested, role)
    flag = _flag(role)
    if gpu_count < 0:
        raise ValueError(f"gpu_count must be >= 0, got {gpu_count}")
    seen = None if visible is None else list(visible)  # a copy: the plan is frozen, the caller's list is not
    if requested == "cpu" or (requested == "auto" and gpu_count == 0):
        return DevicePlan("cpu", None, local, seen, role)
    if gpu_count == 0:
        where = f"{role}, local rank {local.rank} of {local.size}; {_show_visible(visible)}"
        if not cuda_build:
            raise ConfigError(f"{flag} cuda: no GPU is visible to this rank ({where}): this torch is a CPU-only "
                              f"build; install a CUDA build of torch, or use {flag} cpu or {flag} auto")
        raise ConfigError(f"{flag} cuda: no GPU is visible to this rank ({where}; torch sees 0 devices): use "
                          f"{flag} cpu or {flag} auto, or request GPUs from Slurm with --gpus-per-task=1")
    shared = shares_gpu(local, gpu_count, visible)
    if shared and not share:
        why = "" if gpu_count > 1 else f", {_show_visible(visible)} so every rank sees the same one"
        raise ConfigError(f"{flag} {requested}: {local.size} ranks on this node would share {_gpus(gpu_count)}"
                          f"{why}: pass --share-gpus to allow it, run fewer tasks per node, or give each task "
                          f"its own GPU with Slurm --gpus-per-task=1")
    index = local.rank % gpu_count  # 0 for a single GPU: a task bound to one sees it as device 0
    return DevicePlan("cuda", index, local, seen, role, shared=shared)


def select_device(requested: str, role: str, comm: Any = None, env: Mapping[str, str] | None = None,
                  share: bool = False) -> DevicePlan:
    """The device plan of this rank: plan_device on what this process finds.

    `env` defaults to os.environ. The local rank comes from the MPI shared-memory split when `comm`
    is given (a collective: every rank of `comm` must call select_device with it), else from the
    launcher's variables (local_rank_from_env), else LocalRank(0, 1, "single process"). torch is
    imported (for torch.cuda.device_count()) only when `requested` is not "cpu".
    """
    env = os.environ if env is None else env
    # the collective first, before anything that can raise: a rank that stopped at a bad flag would
    # leave the others waiting in the split for good
    local = local_rank_from_comm(comm, wants_gpu=requested != "cpu") if comm is not None else None
    _check_request(requested, role)
    if local is None:
        local = local_rank_from_env(env) or LocalRank(0, 1, SINGLE_SOURCE)
    visible = visible_gpus(env)
    gpu_count, cuda_build = 0, True
    if requested != "cpu":
        import torch

        gpu_count = torch.cuda.device_count()
        # ROCm builds drive AMD GPUs through torch.cuda with torch.version.cuda None: not CPU-only
        cuda_build = torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None
    return plan_device(requested, role, local, gpu_count, visible, share, cuda_build=cuda_build)


def cuda_aware_mpi() -> bool:
    """Whether the MPI library says it can take CUDA device buffers (never raises; False when it
    cannot tell). Asks MPI.Query_cuda_support() where this mpi4py has it (MPIX_Query_cuda_support,
    Open MPI's and MPICH's extension), else looks for a cuda memory kind in the communicator's
    mpi_memory_alloc_kinds (MPI 4.1: "mpi,system,cuda:device" and the like). Imports mpi4py, which
    initializes MPI."""
    try:
        from mpi4py import MPI

        if hasattr(MPI, "Query_cuda_support"):
            return bool(MPI.Query_cuda_support())
        info = MPI.COMM_WORLD.Get_info()
        try:
            return alloc_kinds_have_cuda(info.Get("mpi_memory_alloc_kinds"))
        finally:
            info.Free()
    except Exception:  # an MPI without these queries, or one already finalized: we cannot tell
        return False


def alloc_kinds_have_cuda(kinds: str | None) -> bool:
    """Whether an MPI 4.1 mpi_memory_alloc_kinds value ("mpi,system,cuda:device") names a cuda kind."""
    if not kinds:
        return False
    return any(kind.strip().split(":", 1)[0].strip().lower() == "cuda" for kind in kinds.split(","))
