"""`--scheme ddp`: the PyTorch DistributedDataParallel peer baseline, launched by the same mpiexec.

The N worker ranks train as a torch.distributed process group (gloo, CPU) with no master in the
loop; rank 0 only evaluates and writes the same outputs as every other scheme. It is dgd without
the parameter server: the same model, data, partitions, minibatches, optimizer and injected
delays, and an exact average of all n partition gradients per step, so the slowest worker sets
the pace. What it shares with dgd, and why:

- **Gradients.** Worker i (rank i + 1) computes, at step t, the minibatch gradient of its own
  partition i with draw index t (dgd's placement and `draw_index`), then DDP averages the N
  gradients (allreduce of g_i / N) and every worker applies the same FlatOptimizer step (the
  master's SGD/momentum/Adam) to its own copy of the flat parameters.
- **Same start.** Every rank builds the model from the seed (TorchProblem); the SHA-256 of the
  initial parameters is compared across all ranks before training (and DDP broadcasts worker
  0's parameters on construction anyway). At the end the workers' final parameters are compared
  the same way: a mismatch would mean they did not apply the same steps.
- **Injected delays** (`DelayModel(cfg.delay, n, seed).delay(i, t)`, as dgd) are slept inside
  DDP's communication hook when the worker's local gradient is complete (the last bucket), after
  --compute-time's floor and before that bucket joins the allreduce: "compute, be slow, then
  send", dgd's worker's order, and the logged compute time leaves delay and allreduce out. Every
  peer waits in the allreduce for the slowest one, which sets the pace as dgd's master does.
  (Earlier buckets of a large model are averaged while the backward pass runs, as DDP does.) A
  `hang:` delay never wakes: the allreduce then waits until gloo's timeout (30 min) fails the
  job, unless a stop signal ends it first.
- **Divergence.** Every worker holds the same parameters, so all see NaN or Inf after the same
  update and stop there; rank 0 ends the run as the master does (exit status 4).
- **Rank 0 learns the run from small MPI messages** (on a communicator of its own): every worker
  sends a report per step (loss, delay, compute, allreduce and step times) with a non-blocking
  send, and worker 0 its parameters at evaluation steps (every step with --record-params). Rank
  0 books each step with dgd's collector (all n messages used, exact, staleness 0), so a ddp
  step record has dgd's fields and tools read both alike, then applies RunControl as the master
  does. At evaluation steps the workers wait for rank 0's verdict (go on, or stop at the target
  loss): all stop at the same step, and training pauses while rank 0 evaluates, as it does for
  the parameter server, whose workers idle while the master evaluates.
- **Times** come from worker 0's clock: `step_time` is its iteration (all peers leave every
  allreduce together, so it is every worker's), `wall_time` its training time without the waits
  for evaluations. `compute_time` excludes the delay and the allreduce; `allreduce_time` (extra
  field) is the smallest time any worker spent from its delayed gradient to the average, i.e.
  the allreduce's own cost as the last worker to join sees it. `decode_time` is 0 (there is no
  decode), `bytes_received` counts the gradient bytes the N workers put into the allreduces
  (N x parameters x itemsize per step, what dgd's master receives, headers aside); gloo's
  traffic on the wire depends on its algorithm and is not measured.
- **Not supported** (refused by TrainConfig): checkpoints, --resume, --deadline, --fault. s, c,
  --fr-decode, --max-staleness and --on-stale are ignored. A stop signal makes rank 0 write the
  summary and end the job with exit status 3 (the workers are aborted wherever they are).
- **Rendezvous.** Worker 0 opens a torch TCPStore on an ephemeral port of its host (port 0: no
  race for a free port) and the address reaches every rank by an MPI broadcast. The host name is
  `socket.gethostname()` (or PGC_DDP_HOST); gloo picks its interface from that name unless
  GLOO_SOCKET_IFNAME says otherwise. On a single machine (the tests) gloo needs neither: the host
  name resolves to a local address and both the store and gloo connect over it.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from ..config import TrainConfig
from ..core.collector import make_collector
from ..core.message import Message
from ..core.schemes import CodedScheme, make_scheme
from ..core.stragglers import DelayModel
from ..core.totals import RunTotals
from ..errors import PgcError
from ..learning.optim import make_update
from ..learning.problems import expect_draws, take_data_wait
from ..learning.torch_problem import TorchProblem
from ..runs.metrics import MetricsWriter, Progress, master_times
from .control import ControlSettings
from .drop_threshold import threshold_chooser
from .links import PeerInbox, PeerReporter
from .transport import barrier, duplicate_world
from .worker_job import JobSettings, WorkerJob, WorkerJobs

log = logging.getLogger("pgc_mpi")

# One worker's report of one step, sent to rank 0 as bytes.
REPORT = np.dtype([("step", np.int64), ("loss", np.float64), ("delay", np.float64), ("compute_time", np.float64),
                   ("real_compute_time", np.float64), ("allreduce_time", np.float64), ("step_time", np.float64),
                   ("wall_time", np.float64), ("diverged", np.int64),
                   ("lr", np.float64), ("grad_norm", np.float64), ("computed_share", np.float64),
                   ("data_wait", np.float64)])
# Connecting to the rendezvous store and forming the group: long enough for a busy cluster node.
RENDEZVOUS_TIMEOUT = datetime.timedelta(seconds=300)


def booking_scheme(n: int, seed: int) -> CodedScheme:
    """dgd for n workers: ddp's placement (worker i holds partition i), draw indices and aggregation
    (the mean of all n), with which rank 0 books every step."""
    return make_scheme("dgd", n, 0, seed=seed)


def evaluation_step(cfg: TrainConfig, step: int) -> bool:
    """Whether RunControl evaluates after `step` (every --eval-every steps and the last): the workers
    wait for rank 0's verdict after these steps."""
    return ControlSettings(cfg.steps, cfg.eval_every).evaluation_due(step)


def _params_due(cfg: TrainConfig, step: int) -> bool:
    return cfg.record_params or evaluation_step(cfg, step)


def _digest(w: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(w).tobytes()).hexdigest()


@dataclass
class Peers:
    """One rank's connections in a ddp run: our own MPI communicator for the reports, and on the
    workers the rendezvous store (worker 0 serves it), kept referenced for the group's lifetime."""

    link: object  # an MPI communicator (duplicated from the job's)
    store: object | None = None


def connect(comm, problem: TorchProblem) -> Peers:
    """On every rank (collective): a communicator of our own, the same initial parameters checked on
    every rank, and on the workers the gloo process group of ranks 1..N (rank 0 is not in it)."""
    link = duplicate_world(comm)
    if len(set(link.allgather(_digest(problem.flat.values)))) != 1:
        raise PgcError("ranks built different initial parameters from the same seed (different torch versions?)")
    rank, n = link.Get_rank(), link.Get_size() - 1
    store = None
    if rank == 1:
        host = os.environ.get("PGC_DDP_HOST") or socket.gethostname()
        store = dist.TCPStore(host, 0, n, True, RENDEZVOUS_TIMEOUT, wait_for_workers=False)
        address = (host, store.port)
    address = link.bcast(address if rank == 1 else None, root=1)
    if rank == 0:
        log.info("ddp: %d workers form a gloo group at %s:%d", n, *address)
        return Peers(link)
    if store is None:
        store = dist.TCPStore(address[0], address[1], n, False, RENDEZVOUS_TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank - 1, world_size=n)
    return Peers(link, store)


@dataclass
class _StepClock:
    """The communication hook's state for one step: its job (pgc_mpi.runtime.worker_job: the
    emulated compute floor and delay, DropCompute's stop), how long the local gradient took
    (`real_compute_time`; `compute_time` with --compute-time's floor) and the delay slept."""

    jobs: WorkerJobs
    waited: Callable[[], float] = float  # the seconds spent getting the step's minibatches (float(): 0.0)
    job: WorkerJob | None = None
    real_compute_time: float = 0.0
    compute_time: float = 0.0
    slept: float = 0.0
    data_wait: float = 0.0  # of the step: seconds of compute_time spent getting its minibatches

    def begin(self, step: int) -> WorkerJob:
        """The step's job begins now (with DropCompute's threshold of the moment)."""
        self.job = self.jobs.start_job(step, (0,))
        return self.job

    def gradient_ready(self) -> None:
        """The local gradient is complete: emulate the compute floor, then sleep the injected delay;
        of a job DropCompute cut to a share of its micro-batches, that share of both (the delay is
        slowness of the computation, as for dgd's workers: pgc_mpi.core.drop_compute)."""
        self.data_wait = self.waited()
        self.compute_time, self.real_compute_time, self.slept = self.job.finish(self.data_wait)


def _delayed_allreduce(clock, bucket):  # no annotations: DDP checks them, and here they would be strings
    """DDP's default allreduce (g / N, summed). DDP calls this once per gradient bucket, in order,
    as the backward pass fills them; the last bucket completes the local gradient, so the compute
    floor and the injected delay are slept there: the slow worker holds back the step's last
    allreduce and every peer waits for it (buckets before it overlap the backward pass, as DDP does)."""
    if bucket.is_last():
        clock.gradient_ready()
    return allreduce_hook(None, bucket)


class DdpWorker:
    """One worker rank of a ddp run: DDP training of its own partition, reports to rank 0."""

    def __init__(self, cfg: TrainConfig, peers: Peers, scheme: CodedScheme, problem: TorchProblem,
                 delays: DelayModel, recipe_objects=None):
        self.cfg, self.peers, self.scheme, self.problem = cfg, peers, scheme, problem
        self.worker = peers.link.Get_rank() - 1
        self.partition = scheme.placement[self.worker][0]
        self.micro_batches = cfg.accumulate
        problem.module.train()
        # running statistics (batch norm) stay local, as the parameter server's workers' do: rank 0
        # recalibrates them before evaluating (pgc_mpi.learning.torch_problem)
        self.model = DistributedDataParallel(problem.module, forward_sync_buffers=False)
        # --drop-compute's threshold: fixed, or rank 0's (on the peers' communicator)
        jobs = WorkerJobs(JobSettings.of(cfg), self.worker, delays, peers.link)
        self.clock = _StepClock(jobs, lambda: take_data_wait(problem))
        self.model.register_comm_hook(self.clock, _delayed_allreduce)
        self.w = problem.flat.values  # the module's parameters: the optimizer updates them in place
        self.opt = make_update(cfg, self.w, problem, recipe_objects)
        self.reporter = PeerReporter(peers.link, cfg.poll_interval)
        # with loaders (pgc_mpi.learning.minibatches): the steps ahead whose minibatches it names
        self.ahead = cfg.prefetch if problem.minibatches.loads_ahead else None
        barrier(peers.link, cfg.poll_interval)  # ready: see Monitor.run

    def run(self) -> int:
        """Train until the last step, the target loss or divergence; returns the steps taken."""
        started, paused, steps = time.perf_counter(), 0.0, 0
        for t in range(self.cfg.steps):
            report = self._step(t)
            steps = t + 1
            report["wall_time"] = time.perf_counter() - started - paused
            self.reporter.send(report)
            if self.worker == 0 and _params_due(self.cfg, t):
                self.reporter.send(self.w, params=True)
            if report["diverged"]:  # every worker sees it at the same step (the same parameters)
                break
            if evaluation_step(self.cfg, t):
                waited = time.perf_counter()
                stop = self.reporter.verdict()
                paused += time.perf_counter() - waited
                if stop:
                    break
        self.reporter.flush()
        self.clock.jobs.close()  # the threshold received, if it came after the last step
        dist.destroy_process_group()
        return steps

    def _step(self, t: int) -> np.ndarray:
        """One DDP step: forward, backward (delay and allreduce in the hook), optimizer step."""
        problem, clock = self.problem, self.clock
        clock.begin(t)
        if self.ahead is not None:  # every step is known in advance: the loaders are never wrong
            draws = range(t, t + 1 + self.ahead)
            expect_draws(problem, [(self.partition, self.scheme.draw_index(m, 0)) for m in draws])
        problem.flat.flat_grad.zero_()
        if self.micro_batches == 1:
            loss = problem.minibatch_loss(self.partition, self.scheme.draw_index(t, 0), module=self.model)
            loss.backward()
            loss, share = float(loss.detach()), 1.0
        else:
            loss, share = self._accumulated(t)
        averaged = time.perf_counter()
        problem.flat.check_views()
        np.copyto(self.opt.grad, problem.flat.grads)
        update = self.opt.step()
        report = np.zeros((), dtype=REPORT)
        report["lr"], report["grad_norm"] = update["lr"], update["grad_norm"]
        report["step"], report["loss"], report["delay"] = t, loss, clock.slept
        report["computed_share"], report["data_wait"] = share, clock.data_wait
        report["compute_time"], report["real_compute_time"] = clock.compute_time, clock.real_compute_time
        report["allreduce_time"] = averaged - clock.job.began - clock.compute_time - clock.slept
        report["step_time"] = time.perf_counter() - clock.job.began
        report["diverged"] = not np.isfinite(self.w).all()  # (a sum would warn of its overflow)
        return report

    def _accumulated(self, t: int) -> tuple[float, float]:
        """--accumulate K: the micro-batches (draws K*d .. K*d+K-1, as dgd's Accumulated) under
        no_sync, then one explicit all-reduce of the local mean; with --drop-compute the worker
        starts no micro-batch past the threshold (pgc_mpi.core.drop_compute), and the sum of the
        workers' shares divides the sum: the mean over every micro-batch computed. DDP's own
        all-reduce at the last backward cannot serve here: whether a micro-batch is the last is
        known only once it is done. Returns (the mean loss of the micro-batches done, their share)."""
        problem, clock, k = self.problem, self.clock, self.micro_batches
        first = k * self.scheme.draw_index(t, 0)
        loss, done = 0.0, 0
        with self.model.no_sync():
            while done < k and not (done and clock.job.stop(done)):
                micro = problem.minibatch_loss(self.partition, first + done, module=self.model)
                micro.backward()
                loss += float(micro.detach())
                done += 1
        grad = problem.flat.flat_grad
        grad.div_(k)  # the sum over K, as Accumulated (and a dgd worker's message)
        share = clock.job.share()
        clock.gradient_ready()
        shares = torch.tensor([share], dtype=torch.float64)
        dist.all_reduce(grad)
        dist.all_reduce(shares)
        # dgd's master: the mean of the n messages, or over the micro-batches computed (Collector)
        dropped = float(shares) < self.scheme.n
        grad.mul_(1.0 / float(shares) if dropped else 1.0 / self.scheme.n)
        return loss / done, share


@dataclass
class Monitor:
    """Rank 0 of a ddp run: books the workers' reports as step records, evaluates, decides when to stop."""

    cfg: TrainConfig
    peers: Peers
    scheme: CodedScheme
    problem: TorchProblem
    metrics: MetricsWriter
    progress: Progress
    totals: RunTotals = field(default_factory=RunTotals)
    trajectory: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.scheme.n
        self.reports = np.zeros(n, dtype=REPORT)
        self.params = self.problem.initial_params().astype(self.cfg.dtype)
        self.params_step = -1  # the step whose parameters `params` holds (-1: the initial ones)
        self.began = time.monotonic()  # when training began (Monitor.run sets it)
        self.inbox = PeerInbox(self.peers.link, n, self.reports, self.params, self.cfg.poll_interval)
        # dgd's collector writes the record; the payloads are dummies (the gradient is not here)
        self.collector = make_collector(self.scheme, np.zeros(1))
        self._nothing = np.zeros(1)
        self.grad_bytes = n * self.problem.dim * np.dtype(self.cfg.dtype).itemsize
        # --drop-compute auto: rank 0 chooses the threshold from the booked steps and tells the peers
        self.chooser = threshold_chooser(self.cfg.drop_compute, "ddp", self.cfg.accumulate, self.peers.link,
                                         range(1, self.scheme.n + 1))
        if self.cfg.record_params:
            self.trajectory.append(self.params.copy())

    def evaluate(self) -> dict:
        """RunControl's evaluation: the metrics of the parameters of the step just booked."""
        if self.params_step != self.totals.steps - 1:
            # only a stop signal makes RunControl evaluate between evaluation steps: the workers'
            # parameters of this step never came, and the run ends here anyway
            raise _StopNow
        return self.problem.evaluate(self.params)

    def run(self, control) -> RunTotals:
        """Book every step until the last, the target loss, divergence or a stop signal (`control`
        says which: RunControl, as for the master)."""
        # DDP's construction takes seconds (it imports torch._dynamo): training time starts when every
        # worker is ready, as the master's starts with its first model
        ready = barrier(self.peers.link, self.cfg.poll_interval, functools.partial(control.stop_signal, 0))
        self.began = time.monotonic()
        for t in range(self.cfg.steps if ready else 0):
            due = _params_due(self.cfg, t)
            if not self.inbox.collect(due, functools.partial(control.stop_signal, t)):
                break
            if due:
                self.params_step = t
            if self._diverged(t):
                break
            try:
                stop = self._book(t, control)
            except _StopNow:
                break
            if evaluation_step(self.cfg, t):
                self.inbox.send_verdict(stop)
            if stop:
                break
        return self.totals

    def _diverged(self, t: int) -> bool:
        if (self.reports["step"] != t).any():
            raise PgcError(f"ddp: step {t} expected, the workers reported steps {self.reports['step'].tolist()}")
        if not self.reports["diverged"].any():
            return False
        self.totals.diverged = (f"training diverged at step {t}: the parameters became NaN or Inf after the update "
                                f"(lower --lr, or check the data for NaN/Inf)")
        log.error("%s", self.totals.diverged)
        return True

    def _book(self, t: int, control) -> bool:
        """Write step t's record (dgd's collector: every worker's message used), then RunControl's
        rules; returns True to stop."""
        collector, lead = self.collector, self.reports[0]
        collector.begin(t)
        for i, r in enumerate(self.reports):
            msg = Message(t, i, (t,), loss=float(r["loss"]), compute_time=float(r["compute_time"]),
                          delay=float(r["delay"]), gradients=1, real_compute_time=float(r["real_compute_time"]),
                          computed_share=float(r["computed_share"]), data_wait=float(r["data_wait"]))
            collector.offer(msg, self._nothing)
        record = collector.record(collector.decode(), False)
        self.totals.steps = t + 1
        record = {"step": t, "wall_time": float(lead["wall_time"]), "step_time": float(lead["step_time"]),
                  **master_times(), "bytes_received": (t + 1) * self.grad_bytes,
                  "allreduce_time": float(self.reports["allreduce_time"].min()), **record,
                  "lr": float(lead["lr"]), "grad_norm": float(lead["grad_norm"]),
                  "wire_error": 0.0}  # no --wire-dtype: the all-reduce runs in --dtype
        if self.chooser is not None:
            self.chooser.observe(record)
        self.metrics.write(record)
        if self.cfg.record_params:
            self.trajectory.append(self.params.copy())
        self.progress.update(t, record["train_loss"], float(lead["step_time"]), 0)
        return control.after_step(t, record["train_loss"], record)

    def finish(self) -> None:
        """After a run that was not stopped by a signal: the workers' final parameters must agree."""
        self.inbox.flush()
        digests = self.peers.link.gather(None, root=0)[1:]
        if self.params_step == self.totals.steps - 1 and not self.totals.diverged:
            digests.append(_digest(self.params))
        if len(set(digests)) != 1:
            raise PgcError("ddp: the workers' final parameters differ (or differ from what rank 0 evaluated)")


class _StopNow(Exception):
    """RunControl asked to evaluate a step whose parameters rank 0 does not have (a stop signal)."""


def run_worker(cfg: TrainConfig, peers: Peers, scheme: CodedScheme, problem: TorchProblem,
               delays: DelayModel, recipe_objects=None) -> int:
    """A worker rank's whole ddp run (every peer applies the same update: the run's optimizer,
    schedule and clipping, `recipe_objects` those pgc_mpi.fit was given); returns the steps it took."""
    try:
        steps = DdpWorker(cfg, peers, scheme, problem, delays, recipe_objects).run()
    finally:
        problem.minibatches.close()  # its loaders, if any
    peers.link.gather(_digest(problem.flat.values), root=0)
    return steps
