"""A job's start-up, before any rank trains: rank 0's configuration (validated, its output folder
locked and settled) and preparation (the master's problem, the checkpoint to resume from, the
update), every rank's device and problem, and the collective checks on them (enough memory, the
same problem, every rank's record for the provenance). Whatever rank 0 raises while it sets the run
up becomes an exit status (attempt) that pgc_mpi.job.train sends to every rank."""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable
from pathlib import Path

from ..config import TrainConfig
from ..core.faults import parse_faults
from ..core.shards import shard_bounds
from ..errors import ConfigError, PgcError
from ..runs import run_folder, run_lock
from ..runs.metrics import make_log_dir
from . import provenance
from .checks import memory_fits, one_line, problem_size, say
from .devices import DevicePlan, select_device
from .recipe import RecipeObjects, initial_update


def build_problem(cfg: TrainConfig, n: int, partitions: list[int], verify: bool = False,
                  plan: DevicePlan | None = None, parts=None):
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

    from ..learning.parts import parts_from_names
    from ..learning.torch_problem import problem_of

    torch.set_num_threads(cfg.threads)
    parts = (parts_from_names(cfg.model, cfg.dataset, cfg.loss, cfg.seed, verify) if parts is None else
             parts(cfg, verify))
    try:
        problem = problem_of(parts, n, cfg.batch_size, seed=cfg.seed, dtype=cfg.dtype, partitions=partitions,
                             eval_train=cfg.eval_train, device=None if plan is None else plan.torch_device(),
                             autocast=cfg.autocast, partitioning=cfg.partitioning)
    except torch.cuda.OutOfMemoryError as exc:
        flag = "--master-device" if plan.role == "master" else "--device"
        raise ConfigError(f"the {cfg.model} model and its data do not fit on {plan.name} "
                          f"({one_line(exc)}): use a smaller model or --batch-size, fewer ranks per GPU, or "
                          f"{flag} cpu") from None
    if partitions:  # a worker: a Dataset's minibatches read ahead (pgc_mpi.learning.minibatches)
        problem.minibatches.start_loaders(cfg.loader_processes(problem.minibatches.lazy),
                                          when_slow=cfg.loader_workers == "auto")
    return with_sampling(problem, cfg.fixed_minibatch, cfg.accumulate)


def configure(make_config: Callable[[], TrainConfig], ranks: int, prog: str) -> TrainConfig:
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


def prepare(cfg: TrainConfig, workers: int, plan: DevicePlan, parts, recipe: RecipeObjects) -> tuple:
    """On rank 0: the master's problem (its data file checked, on its device; the user's model, loss
    and data checked on their first samples), the checkpoint to resume from, and the update over
    rank 0's initial parameters where a factory makes it (a bad one is then a one-line error)."""
    problem = build_problem(cfg, workers, partitions=[], verify=cfg.verify_data, plan=plan, parts=parts)
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
        resume = checkpoint.load_resume(cfg.resume, Path(cfg.out) / "checkpoints", identity(cfg, scheme, problem.dim),
                                        encoding)
        path = resume.path
        if resume.step >= cfg.steps:
            raise ConfigError(f"--resume {path}: the checkpoint is at step {resume.step}, not before --steps "
                              f"{cfg.steps}: raise --steps to train further")
        # checkpoints of later steps belong to the abandoned continuation: they must not mix with this one's
        run_folder.drop_checkpoints_after(Path(cfg.out) / "checkpoints", resume.step)
    return problem, resume, initial


def attempt(action, prog: str = "pgc-train") -> tuple[int | None, object]:
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


def identity(cfg: TrainConfig, scheme, dim: int) -> dict:
    """The run's identity that its checkpoints carry (pgc_mpi.runs.checkpoint.run_identity)."""
    from ..runs.checkpoint import run_identity

    return run_identity(scheme, dim, dtype=cfg.dtype, model=cfg.model, dataset=cfg.dataset, seed=cfg.seed,
                        optimizer=cfg.optimizer, problem=cfg.problem, samples=cfg.samples, loss=cfg.loss)


def select_rank_device(cfg: TrainConfig, comm, log) -> DevicePlan:
    """This rank's device (--master-device on rank 0, --device on the workers, the CPU on the other
    servers: they decode and update on it), logged."""
    rank = comm.Get_rank()
    requested = cfg.master_device if rank == 0 else "cpu" if rank < cfg.servers else cfg.device
    plan = select_device(requested, "master" if rank < cfg.servers else "worker", comm=comm, share=cfg.share_gpus)
    log.log(logging.INFO if plan.kind != "cpu" else logging.DEBUG, "%s", plan.describe())
    return plan


def memory_ok(cfg: TrainConfig, comm, scheme, state, prog: str, gpu: bool = False) -> bool:
    """The memory check (checks.memory_fits) on the problem's size as rank 0 knows it (a collective)."""
    size = comm.bcast(problem_size(cfg, state[0], scheme.n) if comm.Get_rank() == 0 else None, root=0)
    return memory_fits(comm, cfg, scheme, size, prog, gpu)


def gather_ranks(comm, log, start: dict, plan: DevicePlan) -> dict:
    """Every rank's provenance.rank_record and device, once its problem is built (a collective):
    into rank 0's start record (config.json's provenance "ranks", by rank), and each rank's own in
    its log at debug level. Returns the start record."""
    record = {**provenance.rank_record(), "device": plan.to_json()}
    log.debug("problem built; %s", provenance.describe_rank(record))
    ranks = comm.gather(record, root=0)
    return {**start, "ranks": ranks} if comm.Get_rank() == 0 else start
