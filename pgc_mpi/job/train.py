"""One training job on every rank (`pgc-train`, and pgc_mpi.fit): the start-up in its order, each
step ended by a verdict every rank receives (pgc_mpi.job.startup), then each rank's part
(pgc_mpi.job.roles). Rank 0 validates and runs the master; ranks 1..N are workers (with --scheme
ddp they train as a torch.distributed group and rank 0 only watches: pgc_mpi.runtime.ddp).
With a synthetic --problem the workers never import torch (nor anything that does): a worker
rank is then numpy and MPI only, small and quick to start, so that many fit on one machine.
config.json's provenance says so, rank by rank ("ranks": whether torch is loaded and the
resident memory once the problem is built), and at --log-level debug every worker logs its
peak resident memory at the end."""

from __future__ import annotations

import ctypes
import hashlib
import socket
import sys
from collections.abc import Callable

from ..config import TrainConfig, config_from_args
from ..core.message import buffers_per_message, gradient_header
from ..core.traits import PEER_SCHEMES
from ..core.wire import wire_format
from ..errors import PgcError
from ..runs import run_lock
from ..runs.metrics import configure_logging, setup_logging
from ..runtime import signals
from ..runtime.transport import abort, duplicate_world, wait_for_all
from . import provenance, shm
from .checks import one_line, same_problem
from .devices import DevicePlan, cuda_aware_mpi
from .outputs import record_failure
from .recipe import RecipeObjects
from .roles import JobOutcome, run_follower, run_master, run_peers, run_worker_rank
from .startup import attempt, build_problem, configure, gather_ranks, memory_ok, prepare, select_rank_device


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-train` (run it under mpiexec/srun with N+1 ranks)."""
    argv = sys.argv[1:] if argv is None else argv
    return run_job(lambda: config_from_args(argv), argv)


def run_job(make_config: Callable[[], TrainConfig], argv: list[str], parts=None, outcome: JobOutcome | None = None,
            prog: str = "pgc-train", recipe: RecipeObjects | None = None) -> int:
    """Run one training job on every rank of MPI's world (pgc-train, and pgc_mpi.fit): rank 0 builds
    and checks the configuration with `make_config`, and `parts` (a function (cfg, verify) ->
    pgc_mpi.learning.parts.ProblemParts) and `recipe` (RecipeObjects) are the model, loss, data,
    optimizer, scheduler and callbacks pgc_mpi.fit was given (None: the configuration names them).
    Returns the exit status; `outcome` receives rank 0's summary and final parameters. `argv`: the
    command line recorded in config.json's provenance; `prog`: the name in error messages."""
    try:
        return _run_job(make_config, argv, parts, outcome, prog, recipe or RecipeObjects())
    finally:
        run_lock.release_all()  # rank 0's lock on the output folder (taken in startup.configure)


def _run_job(make_config: Callable[[], TrainConfig], argv: list[str], parts, outcome: JobOutcome | None,
             prog: str, recipe: RecipeObjects) -> int:
    signals.install()
    comm = duplicate_world()
    # every rank is past MPI_Init (the Dup is a collective): MPICH's start-up segment can go now,
    # so that no way this job ends leaves it to hang a later job (see pgc_mpi.job.shm)
    shm.unlink_own_segments()
    rank, size = comm.Get_rank(), comm.Get_size()
    log = setup_logging(rank)
    # Two steps, each ended by a broadcast of rank 0's verdict: the configuration (no torch, so
    # errors are immediate), then the master's data and checkpoint, while the workers import
    # torch (seconds) in the meantime, unless the problem is synthetic (they never do then).
    # (each wait for rank 0 sleeps, wait_for_all: spinning workers would starve it of shared cores)
    status, cfg = attempt(lambda: configure(make_config, size, prog), prog) if rank == 0 else (None, None)
    wait_for_all(comm)
    status, value = comm.bcast((status, cfg.to_dict() if cfg is not None else None), root=0)
    if status is not None:
        return int(status)
    cfg = TrainConfig(**value)
    if rank > 0 and not cfg.synthetic:
        import torch  # noqa: F401 - see above
    log = configure_logging(rank, cfg.log_level, cfg.log_dir)
    # every rank picks its device (a collective: the node's ranks count the GPUs out among them);
    # a rank that cannot have the one asked for says why, and every rank then stops
    status, plan = attempt(lambda: select_rank_device(cfg, comm, log), prog)
    failed = [s for s in comm.allgather(status) if s is not None]
    if failed:
        return int(failed[0])
    status, state = (attempt(lambda: prepare(cfg, cfg.workers_of(size), plan, parts, recipe), prog) if rank == 0
                     else (None, None))
    wait_for_all(comm)
    status = comm.bcast(status, root=0)
    if status is not None:
        return int(status)
    hosts = comm.gather(socket.gethostname(), root=0)
    try:
        start = {**provenance.start_record(argv, hosts, prog), "mpi_cuda_aware": cuda_aware_mpi()} if rank == 0 else {}
        return _train(cfg, state, comm, log, start, plan, parts, outcome or JobOutcome(), prog, recipe)
    except (PgcError, OSError) as exc:  # e.g. a full disk: one line naming the path is the message
        log.error("%s", exc)
        record_failure(cfg, rank, str(exc))
        abort(1)
    except BaseException as exc:
        log.exception("unexpected error on rank %d; aborting the job", rank)
        record_failure(cfg, rank, one_line(exc))
        abort(1)
    return 1


def _train(cfg: TrainConfig, state, comm, log, start: dict, plan: DevicePlan, parts, outcome: JobOutcome,
           prog: str, recipe: RecipeObjects) -> int:
    wait_for_all(comm)  # rank 0 has been writing its start record (it imports torch and h5py)
    if cfg.scheme in PEER_SCHEMES:
        return run_peers(cfg, state, comm, log, start, plan, parts, outcome, prog, recipe)
    rank, servers = comm.Get_rank(), cfg.servers
    n = cfg.workers_of(comm.Get_size())
    scheme = cfg.make_scheme(n)
    if scheme.kind == "coded":  # every rank must hold the same encoding matrix
        digest = hashlib.sha256(scheme.encoding_matrix().tobytes()).hexdigest()
        if len(set(comm.allgather(digest))) != 1:
            raise PgcError("ranks built different encoding matrices (different numpy versions?)")
    if not memory_ok(cfg, comm, scheme, state, prog, gpu=plan.kind != "cpu"):
        return 2
    problem, resume = (state[:2] if rank == 0 else (None, None) if rank < servers else
                       (build_problem(cfg, n, scheme.placement[rank - servers], plan=plan, parts=parts), None))
    if not same_problem(comm, problem, prog):
        return 2
    start = gather_ranks(comm, log, start, plan)
    wire = wire_format(cfg.wire_dtype, cfg.dtype)
    header = gradient_header(buffers_per_message(scheme))
    if rank >= servers:
        return run_worker_rank(cfg, comm, log, scheme, problem, header, wire, n)
    if rank > 0:
        return run_follower(cfg, comm, log, scheme, header, wire)
    return run_master(cfg, comm, log, scheme, problem, header, wire, resume, start, outcome, prog, state[2], recipe)


def cli() -> None:
    """Console entry: run main(), then finalize MPI and exit at once.

    Everything is written and closed by then; skipping the interpreter's teardown (seconds
    with torch loaded, times every rank on an oversubscribed node) makes jobs end promptly.
    The exit is the C library's exit(), not os._exit(): MPICH tells its process manager that
    the rank finished in a C atexit handler, and a rank that leaves without saying so makes
    MPICH's mpiexec SIGKILL every rank still exiting (the job then ends with status 9 after a
    successful run; measured: 1 run in 20 with 7 ranks on 2 cores).
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    ctypes.CDLL(None).exit(code)


if __name__ == "__main__":
    cli()
