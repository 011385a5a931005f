"""`pgc-train`: the MPI entry point. Rank 0 validates and runs the master; ranks 1..N are workers
(with --scheme ddp they train as a torch.distributed group and rank 0 only watches: pgc_mpi.runtime.ddp).
With a synthetic --problem the workers never import torch (nor anything that does): a worker
rank is then numpy and MPI only, small and quick to start, so that many fit on one machine.
config.json's provenance says so, rank by rank ("ranks": whether torch is loaded and the
resident memory once the problem is built), and at --log-level debug every worker logs its
peak resident memory at the end."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from ..config import TrainConfig, config_from_args
from ..core.faults import parse_faults
from ..core.message import Layout, buffers_per_message, gradient_header
from ..core.stragglers import DelayModel
from ..core.traits import PEER_SCHEMES
from ..core.wire import WireFormat, wire_format
from ..errors import ConfigError, PgcError
from ..runs import run_folder, run_lock
from ..runs.metrics import MetricsWriter, configure_logging, make_log_dir, setup_logging
from . import provenance, shm, signals
from .checks import memory_fits, one_line, problem_size, same_problem, say
from .devices import DevicePlan, cuda_aware_mpi, select_device
from .heartbeat import heartbeat_interval
from .links import FollowerLink, LeaderLink
from .outputs import close_outputs, open_outputs, record_failure
from .recipe import RecipeObjects, initial_update, run_callbacks, start_callbacks
from .servers import shard_bounds
from .transport import MasterTransport, WorkerTransport, abort, duplicate_world, wait_for_all
from .worker import WorkerSettings, run_worker

# Exit status of a run that stopped because training produced NaN or Inf (see Master._update).
EXIT_DIVERGED = 4
# Exit status of a run that ended because a step needed workers that are lost (runtime.lost):
# resume it on the workers that are left (launch/local.sh and train.sbatch do at once).
EXIT_WORKERS_LOST = 5


def _problem(cfg: TrainConfig, n: int, partitions: list[int], verify: bool = False, plan: DevicePlan | None = None,
             parts=None):
    """The model and data of this rank: a worker's stored partitions, or none for the master.
    `verify`: check the data file's checksum (rank 0 does, once; every rank checks the content).
    `plan`: the device to compute on (None: the CPU). `parts`: a function (cfg, verify) ->
    pgc_mpi.learning.parts.ProblemParts of the objects pgc_mpi.fit was given (None: --model, --dataset and
    --loss name them). A synthetic --problem is built whole on every rank, without torch."""
    from ..learning.problems import PROBLEMS, with_sampling

    if cfg.synthetic:
        problem = PROBLEMS[cfg.problem](n, samples=cfg.samples, dim=cfg.dim, batch_size=cfg.batch_size, seed=cfg.seed)
        return with_sampling(problem, cfg.fixed_minibatch, cfg.accumulate)
    import torch

    from ..learning.models import problem_of
    from ..learning.parts import parts_from_names

    torch.set_num_threads(cfg.threads)
    parts = (parts_from_names(cfg.model, cfg.dataset, cfg.loss, cfg.seed, verify) if parts is None else
             parts(cfg, verify))
    try:
        problem = problem_of(parts, n, cfg.batch_size, seed=cfg.seed, dtype=cfg.dtype, partitions=partitions,
                             eval_train=cfg.eval_train, device=None if plan is None else plan.torch_device(),
                             autocast=cfg.autocast)
    except torch.cuda.OutOfMemoryError as exc:
        flag = "--master-device" if plan.role == "master" else "--device"
        raise ConfigError(f"the {cfg.model} model and its data do not fit on {plan.name} "
                          f"({one_line(exc)}): use a smaller model or --batch-size, fewer ranks per GPU, or "
                          f"{flag} cpu") from None
    return with_sampling(problem, cfg.fixed_minibatch, cfg.accumulate)


def _configure(make_config: Callable[[], TrainConfig], ranks: int, prog: str) -> TrainConfig:
    """On rank 0: the configuration `make_config` builds (pgc-train's flags and TOML file, or
    pgc_mpi.fit's keywords), validated for an MPI world of `ranks` ranks, with its output folder
    locked (run_lock: a folder another run is writing to is refused) and then settled
    (run_folder.plan: a folder holding another run is refused; imports no torch)."""
    from dataclasses import replace

    cfg = make_config()
    workers = cfg.workers_of(ranks)
    cfg.validate(workers)
    make_log_dir(cfg.log_dir)
    out = run_folder.resolve_out(cfg)
    lock = run_lock.acquire(out, prog)  # released by run_job when the run ends (or by abort)
    try:
        planned = run_folder.plan(replace(cfg, out=str(out)), workers)
        parse_faults(planned.fault, workers, elastic=planned.resume is not None)  # --resume auto on a new folder
        return planned
    except BaseException:
        lock.release()
        raise


def _prepare(cfg: TrainConfig, workers: int, plan: DevicePlan, parts, recipe: RecipeObjects) -> tuple:
    """On rank 0: the master's problem (its data file checked, on its device; the user's model, loss
    and data checked on their first samples), the checkpoint to resume from, and the update over
    rank 0's initial parameters where a factory makes it (a bad one is then a one-line error)."""
    problem = _problem(cfg, workers, partitions=[], verify=cfg.verify_data, plan=plan, parts=parts)
    shard_bounds(problem.dim, cfg.servers)  # every server must hold a parameter
    # the built-ins wait for the memory check (a vector of dim may not fit); a factory's model does
    initial = initial_update(cfg, problem, recipe) if recipe.has_factories(cfg) else None
    resume = None
    if cfg.resume:
        from ..runs import checkpoint

        run_folder.check_same_data(cfg, problem)  # other data than the run's: refused unless resume_other_data
        scheme = cfg.make_scheme(workers)
        encoding = scheme.encoding_matrix() if scheme.kind == "coded" else None
        # latest: the newest intact checkpoint (damaged newer ones are skipped with a warning); the
        # outputs are then cut at resume.step, that checkpoint's step
        resume = checkpoint.load_resume(cfg.resume, Path(cfg.out) / "checkpoints", _identity(cfg, scheme, problem.dim),
                                        encoding)
        path = resume.path
        if resume.step >= cfg.steps:
            raise ConfigError(f"--resume {path}: the checkpoint is at step {resume.step}, not before --steps "
                              f"{cfg.steps}: raise --steps to train further")
        # checkpoints of later steps belong to the abandoned continuation: they must not mix with this one's
        run_folder.drop_checkpoints_after(Path(cfg.out) / "checkpoints", resume.step)
    return problem, resume, initial


def _outcome(action, prog: str = "pgc-train") -> tuple[int | None, object]:
    """(None, what `action()` returns), or (the exit status, None) when it failed: rank 0 sets the run
    up alone, and whatever it raises must reach every rank as an exit status, or they wait forever."""
    try:
        return None, action()
    except SystemExit as exc:  # --help, or a flag argparse rejected (it printed the message)
        return exc.code if isinstance(exc.code, int) else 2, None
    except PgcError as exc:
        say(f"{prog}: error: {exc}")
        return 2, None
    except Exception as exc:  # noqa: BLE001 - any exception: see the docstring
        say(f"{prog}: error: {one_line(exc)} while setting up the run")
        if os.environ.get("PGC_DEBUG"):
            traceback.print_exc()
        else:
            say(f"{prog}: (set PGC_DEBUG=1 for the traceback)")
        return 1, None


def _identity(cfg: TrainConfig, scheme, dim: int) -> dict:
    from ..runs.checkpoint import run_identity

    return run_identity(scheme, dim, dtype=cfg.dtype, model=cfg.model, dataset=cfg.dataset, seed=cfg.seed,
                        optimizer=cfg.optimizer, problem=cfg.problem, samples=cfg.samples, loss=cfg.loss)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-train` (run it under mpiexec/srun with N+1 ranks)."""
    argv = sys.argv[1:] if argv is None else argv
    return run_job(lambda: config_from_args(argv), argv)


@dataclass
class JobOutcome:
    """What rank 0 keeps of a run for pgc_mpi.fit: the summary record, the final parameters and
    the master's problem (None on the other ranks, and after a failed start)."""

    summary: dict | None = None
    params: np.ndarray | None = None
    problem: object = None
    out: str | None = None


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
        run_lock.release_all()  # rank 0's lock on the output folder (taken in _configure)


def _run_job(make_config: Callable[[], TrainConfig], argv: list[str], parts, outcome: JobOutcome | None,
             prog: str, recipe: RecipeObjects) -> int:
    signals.install()
    comm = duplicate_world()
    # every rank is past MPI_Init (the Dup is a collective): MPICH's start-up segment can go now,
    # so that no way this job ends leaves it to hang a later job (see pgc_mpi.runtime.shm)
    shm.unlink_own_segments()
    rank, size = comm.Get_rank(), comm.Get_size()
    log = setup_logging(rank)
    # Two steps, each ended by a broadcast of rank 0's verdict: the configuration (no torch, so
    # errors are immediate), then the master's data and checkpoint, while the workers import
    # torch (seconds) in the meantime, unless the problem is synthetic (they never do then).
    # (each wait for rank 0 sleeps, wait_for_all: spinning workers would starve it of shared cores)
    status, cfg = _outcome(lambda: _configure(make_config, size, prog), prog) if rank == 0 else (None, None)
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
    status, plan = _outcome(lambda: _select_device(cfg, comm, log), prog)
    failed = [s for s in comm.allgather(status) if s is not None]
    if failed:
        return int(failed[0])
    status, state = (_outcome(lambda: _prepare(cfg, cfg.workers_of(size), plan, parts, recipe), prog) if rank == 0
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


def _select_device(cfg: TrainConfig, comm, log) -> DevicePlan:
    """This rank's device (--master-device on rank 0, --device on the workers, the CPU on the other
    servers: they decode and update on it), logged."""
    rank = comm.Get_rank()
    requested = cfg.master_device if rank == 0 else "cpu" if rank < cfg.servers else cfg.device
    plan = select_device(requested, "master" if rank < cfg.servers else "worker", comm=comm, share=cfg.share_gpus)
    log.log(logging.INFO if plan.kind != "cpu" else logging.DEBUG, "%s", plan.describe())
    return plan


def _train(cfg: TrainConfig, state, comm, log, start: dict, plan: DevicePlan, parts, outcome: JobOutcome,
           prog: str, recipe: RecipeObjects) -> int:
    wait_for_all(comm)  # rank 0 has been writing its start record (it imports torch and h5py)
    if cfg.scheme in PEER_SCHEMES:
        return _train_peers(cfg, state, comm, log, start, plan, parts, outcome, prog, recipe)
    rank, servers = comm.Get_rank(), cfg.servers
    n = cfg.workers_of(comm.Get_size())
    scheme = cfg.make_scheme(n)
    if scheme.kind == "coded":  # every rank must hold the same encoding matrix
        digest = hashlib.sha256(scheme.encoding_matrix().tobytes()).hexdigest()
        if len(set(comm.allgather(digest))) != 1:
            raise PgcError("ranks built different encoding matrices (different numpy versions?)")
    if not _memory_ok(cfg, comm, scheme, state, prog, gpu=plan.kind != "cpu"):
        return 2
    problem, resume = (state[:2] if rank == 0 else (None, None) if rank < servers else
                       (_problem(cfg, n, scheme.placement[rank - servers], plan=plan, parts=parts), None))
    if not same_problem(comm, problem, prog):
        return 2
    start = _gather_ranks(comm, log, start, plan)
    wire = wire_format(cfg.wire_dtype, cfg.dtype)
    header = gradient_header(buffers_per_message(scheme))
    if rank >= servers:
        layout = Layout(header, problem.dim, wire.storage)
        settings = WorkerSettings.of(cfg, scheme)
        link = WorkerTransport(comm, layout, cfg.poll_interval, wire, shard_bounds(problem.dim, servers)
                               if servers > 1 else None, heartbeat=heartbeat_interval(cfg.lost_after))
        computed = run_worker(rank - servers, scheme, problem, link, DelayModel(cfg.delay, n, seed=cfg.seed),
                              settings)
        _log_rank_end(log, f"{computed} gradients computed")
        return 0
    if rank > 0:
        return _run_follower(cfg, comm, log, scheme, header, wire)
    return _run_master(cfg, comm, log, scheme, problem, header, wire, resume, start, outcome, prog, state[2], recipe)


def _memory_ok(cfg: TrainConfig, comm, scheme, state, prog: str, gpu: bool = False) -> bool:
    """The memory check (checks.memory_fits) on the problem's size as rank 0 knows it (a collective)."""
    size = comm.bcast(problem_size(cfg, state[0], scheme.n) if comm.Get_rank() == 0 else None, root=0)
    return memory_fits(comm, cfg, scheme, size, prog, gpu)


def _gather_ranks(comm, log, start: dict, plan: DevicePlan) -> dict:
    """Every rank's provenance.rank_record and device, once its problem is built (a collective):
    into rank 0's start record (config.json's provenance "ranks", by rank), and each rank's own in
    its log at debug level. Returns the start record."""
    record = {**provenance.rank_record(), "device": plan.to_json()}
    log.debug("problem built; %s", provenance.describe_rank(record))
    ranks = comm.gather(record, root=0)
    return {**start, "ranks": ranks} if comm.Get_rank() == 0 else start


def _log_rank_end(log, what: str) -> None:
    """A worker's last debug line: what it did, its peak resident memory and whether torch was loaded."""
    log.debug("stopped: %s; %s", what, provenance.describe_rank(provenance.rank_record()))


def _master_settings(cfg: TrainConfig, scheme, leads: bool):
    """The step loop's settings; `leads`: rank 0's (the other servers keep no trajectory). The recipe
    is the followers' (rank 0's update is built in _prepare): no schedule, rank 0 commits each lr."""
    from ..learning.optim import Recipe
    from .master import MasterSettings

    return MasterSettings(steps=cfg.steps, deadline=cfg.deadline, on_deadline=cfg.on_deadline, adapt=cfg.adapt,
                          max_staleness=cfg.staleness_bound(scheme), record_params=cfg.record_params and leads,
                          probe_every=cfg.eval_every, lost_after=cfg.lost_after if leads else None,
                          abandon_late=cfg.abandons_late(), drop_compute=cfg.drop_compute, micro_batches=cfg.accumulate,
                          recipe=Recipe.of(cfg, lr_schedule="constant", warmup_steps=0))


def _run_follower(cfg: TrainConfig, comm, log, scheme, header, wire: WireFormat) -> int:
    """Ranks 1..K-1 with --servers K: the step loop on this rank's shard, rank 0's orders obeyed
    (pgc_mpi.runtime.servers; with pbs, its arrivals, answers and decodes repeated), then the shutdown of
    its links to the workers."""
    from .master import Master
    from .servers import FollowerControl, server_report

    control = FollowerControl(FollowerLink(comm, cfg.poll_interval), follows_arrivals=scheme.kind == "table")
    params, resume = control.link.receive_start()
    link = MasterTransport(comm, scheme.n, Layout(header, len(params), wire.storage), cfg.poll_interval, wire,
                           first_worker=cfg.servers)
    master = Master(_master_settings(cfg, scheme, leads=False), scheme, params, link, resume=resume)
    table = getattr(master.collector, "table", None)
    control.attach(master.w, master.opt.opt, master.start, None if table is None else table.grads)
    totals = master.run(control)
    if totals.diverged:
        raise PgcError(f"server {comm.Get_rank()}: {totals.diverged}")
    control.wait_for_end()
    control.link.send_report(server_report(comm.Get_rank(), totals, link.bytes_received))
    abandoned = link.shutdown(cfg.grace)
    if abandoned:  # rank 0 has written the run's outputs (it reports its own abandoned workers)
        abort(0)  # a diverged shard raised above: this run completed
    _log_rank_end(log, f"server of parameters {len(params)}, {totals.steps} steps")
    return 0


def _run_master(cfg: TrainConfig, comm, log, scheme, problem, header, wire: WireFormat, resume,
                start: dict, outcome: JobOutcome, prog: str, initial: tuple, recipe: RecipeObjects) -> int:
    from ..runs.checkpoint import Checkpointer
    from .master import Master
    from .servers import Leader, server_report

    out, metrics, progress = open_outputs(cfg, comm, log, scheme, problem, start, resume)
    shards = shard_bounds(problem.dim, cfg.servers)
    leader = Leader(LeaderLink(comm, cfg.servers, cfg.poll_interval), shards) if cfg.servers > 1 else None
    params, update = initial or (problem.initial_params().astype(wire.compute), None)
    if leader is not None:  # first: the other servers build their update while rank 0 builds its own
        leader.start(params, resume)
    if update is None:
        params, update = initial_update(cfg, problem, recipe, params)
    own = shards[0]
    link = MasterTransport(comm, scheme.n, Layout(header, own.stop - own.start, wire.storage), cfg.poll_interval,
                           wire, first_worker=cfg.servers)
    checkpointer = Checkpointer(out / "checkpoints", _identity(cfg, scheme, problem.dim), cfg.to_dict(),
                                keep=cfg.keep_checkpoints)
    control = _control(cfg, out, lambda: problem.evaluate(master.full_params()), metrics, leader,
                       callbacks=run_callbacks(cfg, recipe))
    master = Master(_master_settings(cfg, scheme, leads=True), scheme, params, link, metrics, progress, checkpointer,
                    resume, problem=problem, own=own, servers=leader, optimizer=update)
    master.control = control
    start_callbacks(control, master, out, resume)
    began = time.monotonic()
    totals = master.run(control)
    servers = None
    if leader is not None and not control.stopped_by:
        servers = [server_report(0, totals, link.bytes_received), *leader.end(totals.steps, cfg.grace)]
    outcome.summary = close_outputs(cfg, scheme, totals, control, time.monotonic() - began, metrics, progress,
                                     master.trajectory, servers, prog=prog)
    # master.w, not full_params(): with --servers K that gathers the shards, and the other servers are
    # past their step loop by now (it would wait for them forever). The run's last step was
    # evaluated, and the evaluation gathered the whole vector into master.w then.
    outcome.params, outcome.problem, outcome.out = master.w.copy(), problem, cfg.out
    control.end(outcome.summary)
    if control.stopped_by:
        # No stop handshake: the abort ends the workers anyway, and a signal often means that
        # part of the job is gone (Slurm cancels a step on a node failure with SIGTERM), where
        # a message to a dead node's rank can crash MPICH. MPICH's mpiexec does not always
        # report rank 0's own exit status after a forwarded signal, but it reports an abort's.
        metrics.close()
        _stop_job(log, control.stopped_by)
    abandoned = link.shutdown(cfg.grace)
    code = EXIT_DIVERGED if totals.diverged else EXIT_WORKERS_LOST if totals.lost else 0
    if abandoned:
        log.warning("workers %s (ranks %s) did not stop within %.0f s and are abandoned (hung, or their node "
                    "is gone); ending the job with MPI_Abort(%d) since the run's outputs are written",
                    abandoned, [w + link.first_worker for w in abandoned], cfg.grace, code)
        metrics.write({"event": "shutdown", "abandoned": abandoned})
        metrics.close()
        abort(code)
    metrics.close()
    return code


def _stop_job(log, signal_name: str) -> NoReturn:
    """End a run stopped by a signal with EXIT_STOPPED, saying first that MPI's abort banner that
    follows is intended (it must not read as a crash in a batch log)."""
    log.warning("stopped by %s as requested; the MPI_Abort message that follows is intended (exit status %d: "
                "resume with --resume auto, or let the batch script requeue)", signal_name, signals.EXIT_STOPPED)
    abort(signals.EXIT_STOPPED)


def _train_peers(cfg: TrainConfig, state, comm, log, start: dict, plan: DevicePlan, parts, outcome: JobOutcome,
                 prog: str, recipe: RecipeObjects) -> int:
    """--scheme ddp (pgc_mpi.runtime.ddp): the workers train as a torch.distributed group; rank 0, outside
    it, evaluates and writes the same outputs as the master does."""
    from . import ddp

    rank, n = comm.Get_rank(), comm.Get_size() - 1
    scheme = ddp.booking_scheme(n, cfg.seed)
    if not _memory_ok(cfg, comm, scheme, state, prog):
        return 2
    problem = state[0] if rank == 0 else _problem(cfg, n, partitions=scheme.placement[rank - 1], parts=parts)
    if not same_problem(comm, problem, prog):
        return 2
    start = _gather_ranks(comm, log, start, plan)
    peers = ddp.connect(comm, problem)
    if rank > 0:
        ddp.run_worker(cfg, peers, scheme, problem, DelayModel(cfg.delay, n, seed=cfg.seed), recipe)
        _log_rank_end(log, "ddp worker done")
        return 0
    out, metrics, progress = open_outputs(cfg, comm, log, scheme, problem, start)
    monitor = ddp.Monitor(cfg, peers, scheme, problem, metrics, progress)
    control = _control(cfg, out, monitor.evaluate, metrics, callbacks=run_callbacks(cfg, recipe))
    start_callbacks(control, None, out, None)
    totals = monitor.run(control)
    outcome.summary = close_outputs(cfg, scheme, totals, control, time.monotonic() - monitor.began, metrics,
                                     progress, monitor.trajectory, prog=prog)
    outcome.params, outcome.problem, outcome.out = monitor.params.copy(), problem, cfg.out
    control.end(outcome.summary)
    if control.stopped_by:  # the workers are still in their loop: the abort ends them (status 3: requeue)
        metrics.close()
        _stop_job(log, control.stopped_by)
    monitor.finish()
    metrics.close()
    return EXIT_DIVERGED if totals.diverged else 0


def _control(cfg: TrainConfig, out: Path, evaluate, metrics: MetricsWriter, servers=None, callbacks=None):
    """The run's RunControl: evaluations, the target loss, checkpoints and stop signals (and the
    other servers' orders, with --servers: pgc_mpi.runtime.servers.Leader; the callbacks)."""
    from .control import ControlSettings, RunControl

    return RunControl(ControlSettings(cfg.steps, cfg.eval_every, cfg.target_loss, cfg.checkpoint_every, lr=cfg.lr), out,
                      evaluate=evaluate, write=metrics.write, servers=servers, callbacks=callbacks)


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
