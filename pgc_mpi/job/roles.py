"""Each rank's part of a run, once the start-up is done (pgc_mpi.job.startup): a worker's loop, a
follower server's (--servers K: ranks 1..K-1), rank 0's with the run's outputs, and with --scheme
ddp the peers' and rank 0's watch; and the exit status each ends with. What rank 0 keeps of the run
for pgc_mpi.fit goes into a JobOutcome."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from ..config import TrainConfig
from ..core.faults import parse_faults
from ..core.message import Layout
from ..core.shards import shard_bounds
from ..core.stragglers import DelayModel
from ..core.wire import WireFormat
from ..errors import PgcError
from ..runs.metrics import MetricsWriter
from ..runtime import signals
from ..runtime.heartbeat import heartbeat_interval
from ..runtime.links import FollowerLink, LeaderLink
from ..runtime.transport import MasterTransport, WorkerTransport, abort
from ..runtime.worker import WorkerSettings, run_worker
from . import provenance
from .checks import same_problem
from .devices import DevicePlan
from .outputs import close_outputs, open_outputs
from .recipe import RecipeObjects, initial_update, run_callbacks, start_callbacks
from .startup import build_problem, gather_ranks, identity, memory_ok

# Exit status of a run that stopped because training produced NaN or Inf (see Master._update).
EXIT_DIVERGED = 4
# Exit status of a run that ended because a step needed workers that are lost (runtime.lost):
# resume it on the workers that are left (launch/local.sh and train.sbatch do at once).
EXIT_WORKERS_LOST = 5


@dataclass
class JobOutcome:
    """What rank 0 keeps of a run for pgc_mpi.fit: the summary record, the final parameters and
    the master's problem (None on the other ranks, and after a failed start)."""

    summary: dict | None = None
    params: np.ndarray | None = None
    problem: object = None
    out: str | None = None


def log_rank_end(log, what: str) -> None:
    """A worker's last debug line: what it did, its peak resident memory and whether torch was loaded."""
    log.debug("stopped: %s; %s", what, provenance.describe_rank(provenance.rank_record()))


def run_worker_rank(cfg: TrainConfig, comm, log, scheme, problem, header, wire: WireFormat, n: int) -> int:
    """A worker rank: its step loop (pgc_mpi.runtime.worker) over its link to the servers."""
    servers = cfg.servers
    layout = Layout(header, problem.dim, wire.storage)
    minibatches = getattr(problem, "minibatches", None)  # a torch problem's (pgc_mpi.learning.minibatches)
    settings = WorkerSettings.of(cfg, scheme, loads_ahead=minibatches is not None and minibatches.loads_ahead)
    link = WorkerTransport(comm, layout, cfg.poll_interval, wire, shard_bounds(problem.dim, servers)
                           if servers > 1 else None, heartbeat=heartbeat_interval(cfg.lost_after))
    try:
        # a resumed start drops the faults that name a worker it lacks
        faults = tuple(parse_faults(cfg.fault, scheme.n, elastic=cfg.resume is not None))
        computed = run_worker(comm.Get_rank() - servers, scheme, problem, link,
                              DelayModel(cfg.delay, n, seed=cfg.seed), settings, faults)
    finally:
        if minibatches is not None:
            minibatches.close()
    log_rank_end(log, f"{computed} gradients computed")
    return 0


def _master_settings(cfg: TrainConfig, scheme, leads: bool):
    """The step loop's settings; `leads`: rank 0's (the other servers keep no trajectory). The recipe
    is the followers' (rank 0's update is built in startup.prepare): no schedule, rank 0 commits each lr."""
    from ..learning.optim import Recipe
    from ..runtime.master import MasterSettings

    return MasterSettings(steps=cfg.steps, deadline=cfg.deadline, on_deadline=cfg.on_deadline, adapt=cfg.adapt,
                          max_staleness=cfg.staleness_bound(scheme), record_params=cfg.record_params and leads,
                          probe_every=cfg.eval_every, lost_after=cfg.lost_after if leads else None,
                          abandon_late=cfg.abandons_late(), drop_compute=cfg.drop_compute, micro_batches=cfg.accumulate,
                          recipe=Recipe.of(cfg, lr_schedule="constant", warmup_steps=0))


def run_follower(cfg: TrainConfig, comm, log, scheme, header, wire: WireFormat) -> int:
    """Ranks 1..K-1 with --servers K: the step loop on this rank's shard, rank 0's orders obeyed
    (pgc_mpi.runtime.servers; with pbs, its arrivals, answers and decodes repeated), then the shutdown of
    its links to the workers."""
    from ..runtime.master import Master
    from ..runtime.servers import FollowerControl, server_report

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
    log_rank_end(log, f"server of parameters {len(params)}, {totals.steps} steps")
    return 0


def run_master(cfg: TrainConfig, comm, log, scheme, problem, header, wire: WireFormat, resume,
               start: dict, outcome: JobOutcome, prog: str, initial: tuple, recipe: RecipeObjects) -> int:
    """Rank 0: the run's outputs opened, its step loop (leading the other servers with --servers K),
    the outputs closed and the workers stopped; the exit status."""
    from ..runs.checkpoint import Checkpointer
    from ..runtime.master import Master
    from ..runtime.servers import Leader, server_report

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
    checkpointer = Checkpointer(out / "checkpoints", identity(cfg, scheme, problem.dim), cfg.to_dict(),
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


def run_peers(cfg: TrainConfig, state, comm, log, start: dict, plan: DevicePlan, parts, outcome: JobOutcome,
              prog: str, recipe: RecipeObjects) -> int:
    """--scheme ddp (pgc_mpi.runtime.ddp): the workers train as a torch.distributed group; rank 0, outside
    it, evaluates and writes the same outputs as the master does."""
    from ..runtime import ddp

    rank, n = comm.Get_rank(), comm.Get_size() - 1
    scheme = ddp.booking_scheme(n, cfg.seed)
    if not memory_ok(cfg, comm, scheme, state, prog):
        return 2
    problem = state[0] if rank == 0 else build_problem(cfg, n, partitions=scheme.placement[rank - 1], parts=parts)
    if not same_problem(comm, problem, prog):
        return 2
    start = gather_ranks(comm, log, start, plan)
    peers = ddp.connect(comm, problem)
    if rank > 0:
        ddp.run_worker(cfg, peers, scheme, problem, DelayModel(cfg.delay, n, seed=cfg.seed), recipe)
        log_rank_end(log, "ddp worker done")
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
    from ..runtime.control import ControlSettings, RunControl

    return RunControl(ControlSettings(cfg.steps, cfg.eval_every, cfg.target_loss, cfg.checkpoint_every, lr=cfg.lr), out,
                      evaluate=evaluate, write=metrics.write, servers=servers, callbacks=callbacks)
