"""Start-up checks that every rank takes part in (collectives), each ending in one line from rank
0 and the same verdict on every rank: the same data and the same model everywhere, and enough
memory for it."""

from __future__ import annotations

import math
import socket
import sys
from pathlib import Path


def say(line: str) -> None:
    """One line on standard error in a single write: mpiexec interleaves the ranks' output write by
    write, and a message whose newline came in a second write ran into another rank's line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type, and its message's first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def same_problem(comm, problem, prog: str) -> bool:
    """Whether every rank holds the same training data (same_data), then the same model (same_model); a
    collective, the same verdict on every rank. The data first: data that differ can make models differ
    (their number of classes), and the data are then the thing to fix."""
    return same_data(comm, problem, prog) and same_model(comm, problem, prog)


def same_data(comm, problem, prog: str) -> bool:
    """Whether every rank that built a problem holds the training data rank 0 holds (their fingerprints,
    pgc_mpi.learning.fingerprint; a collective). Exact decoding needs every holder of a partition to
    compute on the same rows: data drawn without a seed differ on every rank, and the decoded
    gradient is then silently wrong. Rank 0 names the ranks that differ, in one line, otherwise; a
    rank whose Dataset cannot be read is named with its error. Only the training data are compared:
    the workers never read the test data (rank 0 evaluates), which config.json records for resumes.
    Ranks without a fingerprint (HDF5 files, checked when opened; synthetic problems; the other
    servers) take no part in the comparison."""
    from ..errors import PgcError
    from ..learning.fingerprint import describe, problem_fingerprint

    try:
        found = problem_fingerprint(problem)
        mine: tuple[str | None, str | None] = (found["train"] if found else None, None)
    except PgcError as exc:  # a failing __getitem__: said by rank 0, and every rank stops
        mine = (None, str(exc))
    gathered = comm.gather(mine, root=0)
    message = None
    if comm.Get_rank() == 0:
        failed = [(rank, error) for rank, (_, error) in enumerate(gathered) if error]
        ours = gathered[0][0]
        other = [rank for rank, (theirs, _) in enumerate(gathered) if ours and theirs and theirs != ours]
        if failed:
            message = f"{prog}: error: rank {failed[0][0]}: {failed[0][1]}"
        elif other:
            message = (f"{prog}: error: rank{'s' if len(other) > 1 else ''} {', '.join(map(str, other))} of "
                       f"{len(gathered)} hold{'' if len(other) > 1 else 's'} other training data than rank 0 "
                       f"(fingerprint {describe(gathered[other[0]][0])}, rank 0's {describe(ours)}): every rank "
                       f"must hold the same data, or exact decoding computes a wrong gradient; seed what draws it "
                       f"(np.random.default_rng(SEED), torch.manual_seed(SEED)) or load the same files on every rank")
        if message:
            say(message)
    return comm.bcast(message, root=0) is None


def same_model(comm, problem, prog: str) -> bool:
    """Whether every rank that built a problem built the same parameters (count and shapes, in
    order; a collective). Rank 0 says which rank differs, in one line, otherwise: a factory that
    reads something rank-dependent, or files that differ between nodes."""
    shapes = getattr(problem, "param_shapes", None) if problem is not None else None
    gathered = comm.gather(shapes, root=0)
    message = None
    if comm.Get_rank() == 0:
        mine = gathered[0]
        for rank, theirs in enumerate(gathered):
            if theirs is not None and theirs != mine:
                message = (f"{prog}: error: rank {rank} built a model with {len(theirs)} parameter tensors "
                           f"({sum(_count(s) for s in theirs)} numbers), rank 0 one with {len(mine)} "
                           f"({sum(_count(s) for s in mine)}): every rank must build the same model (a factory "
                           f"that depends on the rank, or files that differ between nodes?)")
                say(message)
                break
    return comm.bcast(message, root=0) is None


def _count(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def problem_size(cfg, problem, n: int):
    """The ProblemSize of a run (pgc_mpi.config.memory), from rank 0's problem."""
    from ..config.memory import synthetic_size, torch_size

    if cfg.synthetic:
        return synthetic_size(cfg)
    info = problem.info
    return torch_size(problem.dim, info.sample_shape, info.num_train, info.num_test, n,
                      held=not getattr(problem.source, "lazy", False), eval_train=problem.eval_train,
                      batch_size=cfg.batch_size)


def available_memory(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> tuple[float, str]:
    """(bytes the processes of this node may still allocate, where that figure comes from): the
    node's MemAvailable, or less where a cgroup (Slurm's job cgroup, a container) allows less. In
    a cgroup the inactive file cache counts as free: the kernel reclaims it before it refuses
    memory (a job that has just read a large data file has it charged to its usage). `proc` and
    `cgroup_root` are where /proc and /sys/fs/cgroup are (other folders in tests)."""
    best, source = math.inf, "unknown"
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                best, source = int(line.split()[1]) * 1024.0, "MemAvailable"
    except OSError:
        pass
    for limit, used, where in _cgroup_limits(proc, cgroup_root):
        if limit - used < best:
            best, source = float(limit - used), (f"cgroup {where}: limit {limit / (1 << 30):.1f} GiB, "
                                                 f"{used / (1 << 30):.1f} GiB used besides reclaimable file cache")
    return best, source


def _stat_value(stat_file: Path, key: str) -> int:
    """The value of `key` in a cgroup's memory.stat (0 where it is absent or unreadable)."""
    try:
        for line in stat_file.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_limits(proc: Path, cgroup_root: Path):
    """(limit, usage less inactive file cache, folder) of this process's memory cgroup and of each
    of its ancestors that has a limit (cgroup v2, or v1's memory controller)."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            root, limit_file, usage_file, cache = cgroup_root, "memory.max", "memory.current", "inactive_file"
        elif "memory" in controllers.split(","):
            root, limit_file, usage_file = cgroup_root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
            cache = "total_inactive_file"  # v1's usage counts the cgroups below too, and so does total_*
        else:
            continue
        folder = root / path.lstrip("/")
        while True:
            try:
                limit = (folder / limit_file).read_text().strip()
                used = int((folder / usage_file).read_text()) - _stat_value(folder / "memory.stat", cache)
                if limit != "max" and int(limit) < 1 << 60:  # v1 says "no limit" with a huge number
                    yield int(limit), max(used, 0), str(folder)
            except (OSError, ValueError):
                pass
            if folder == root or folder.parent == folder:
                break
            folder = folder.parent


def memory_fits(comm, cfg, scheme, size, prog: str, gpu: bool = False) -> bool:
    """Whether the ranks of every node can allocate what they will need (pgc_mpi.config.memory's
    estimate of host memory; a collective), checked before they allocate it: otherwise rank 0 says,
    in one line, which node, how much its ranks need and how much is available. `gpu`: this rank
    computes on a GPU (its model is not charged to the host). With --no-memory-check: True."""
    from mpi4py import MPI

    from ..config.memory import gib, rank_need

    if not cfg.memory_check:
        return True
    rank = comm.Get_rank()
    # rank 0 built its problem before the check (it is resident): only what is still to come counts
    need = rank_need(cfg, scheme, size, rank, built=rank == 0, torch_loaded="torch" in sys.modules, gpu=gpu)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    needs = node.gather((rank, need), root=0)
    message = None
    if node.Get_rank() == 0:
        total = sum(n.total for _, n in needs)
        available, source = available_memory()
        if total > available:
            rank_of, big = max(needs, key=lambda rn: rn[1].total)
            message = (f"{prog}: error: not enough memory on {socket.gethostname()} for this run: its {len(needs)} "
                       f"ranks would allocate about {gib(total)} more (rank {rank_of}, a {big.role}: "
                       f"{big.describe()}), and {gib(available)} is available ({source}); use a smaller model, "
                       f"fewer ranks per node, a narrower --wire-dtype, more --servers, or --no-memory-check if you "
                       f"know better")
    node.Free()
    messages = [m for m in comm.allgather(message) if m]
    if messages and rank == 0:
        say(messages[0])
    return not messages
