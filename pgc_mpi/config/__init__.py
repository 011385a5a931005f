"""Run configurations: the settings pgc-train and pgc-sim share, and each command's own.

CoreConfig holds what means the same in both commands (scheme, s, c, steps, optimizer, delays,
deadline, seed) with one set of defaults and one validation; TrainConfig (pgc-train) and
SimConfig (pgc-sim, the simulator) extend it. pgc-train's precedence: built-in defaults <
--config FILE.toml < command-line flags. Everything is validated here, with messages that say
what to change.

This module imports neither torch nor mpi4py (`pgc-train --help`, a configuration error on rank
0, `pgc-sim --help` and `pgc-bench --dry-run` stay fast): the names it checks against come from
pgc_mpi.choices.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..choices import BUILTIN_DATASETS, DEADLINE_POLICIES, DTYPE_NAMES, MODELS, OPTIMIZERS, PEER_SCHEMES
from ..core.faults import KINDS as FAULT_KINDS
from ..core.faults import parse_faults
from ..core.schemes import FR_DECODE_RULES, ON_STALE, SCHEME_NAMES, CodedScheme, PbsScheme, make_scheme
from ..core.stragglers import USAGE as DELAY_USAGE
from ..core.stragglers import DelayModel
from ..core.wire import WIRE_DTYPES
from ..errors import ConfigError
from ..learning.plugins import is_spec
from ..learning.problems import PROBLEMS
from ..runtime.devices import DEVICE_CHOICES


def check_deadline(deadline: float | None, policy: str) -> None:
    """Raise ConfigError unless `deadline` is None or a number > 0 and `policy` is a known one
    (the same rule for pgc-train's and the simulator's configurations)."""
    if deadline is not None and not (_is_number(deadline) and math.isfinite(deadline) and deadline > 0):
        raise ConfigError(f"--deadline must be a number > 0, got {deadline!r}")
    if policy not in DEADLINE_POLICIES:
        raise ConfigError(f"--on-deadline {policy!r} is not one of: {', '.join(DEADLINE_POLICIES)}")


MAX_SEED = 2**63 - 1

# pgc-train's problem: a torch model on a data set (these defaults), or a synthetic --problem with
# SYNTHETIC_DEFAULTS (pgc-sim's, and the same option names); TrainConfig resolves which.
DEFAULT_MODEL, DEFAULT_DATASET, DEFAULT_BATCH_SIZE = "logreg", "digits", 32
SYNTHETIC_DEFAULTS = {"samples": 1200, "dim": 20}
# least-squares and logistic hold a samples x dim data matrix (float64) on every rank: pgc-train
# refuses more elements than this (128 MiB); quadratic holds none
MATRIX_ELEMENTS_LIMIT = 2**24


def refuse_mixed_problem(synthetic: list[str], torch: list[str]) -> None:
    """The one error for options of both kinds of problem (pgc-train's and pgc-sim's): `synthetic`
    and `torch` are the options given of each kind, as the user typed them."""
    if synthetic and torch:
        raise ConfigError(f"{', '.join(synthetic)} (a synthetic problem) and {' and '.join(torch)} (a torch model "
                          f"on a data set) exclude each other: give one kind or the other")


def check_plugin_names(model: object, loss: object) -> None:
    """--model: a built-in name or PATH:NAME; --loss: PATH:NAME or none (what they name is imported
    and checked when the problem is built: pgc_mpi.learning.parts)."""
    if not (model in MODELS or is_spec(model)):
        raise ConfigError(f"--model {model!r} is neither a built-in model ({', '.join(MODELS)}) nor PATH:NAME (a "
                          f"module like mypkg.nets or a file like ./nets.py, a colon, and a model factory in it)")
    if loss is not None and not is_spec(loss):
        raise ConfigError(f"--loss {loss!r} is not PATH:NAME (a module like mypkg.losses or a file like "
                          f"./losses.py, a colon, and a loss(output, target) function in it); leave it out for "
                          f"the default loss")


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS)
        return os.cpu_count() or 1


@dataclass(frozen=True)
class CoreConfig:
    """The settings pgc-train and pgc-sim share: the same names, meanings and defaults in both."""

    scheme: str = "pgc-cr"
    stragglers: int = 1
    c: int | None = None
    replication: int | None = None
    steps: int = 200
    lr: float = 0.5
    optimizer: str = "sgd"
    momentum: float = 0.9
    delay: str = "none"
    deadline: float | None = None
    on_deadline: str = "wait"
    max_staleness: int | str = "window"
    on_stale: str = "refresh"
    seed: int = 0
    fr_decode: str = "covered"
    adapt: bool = False
    fixed_minibatch: bool = False
    wire_dtype: str | None = None

    def validate_core(self, workers: int) -> None:
        """Check the shared fields, then that the scheme, s, c and the delay model fit `workers` workers."""
        names = self.scheme_names()
        if self.scheme in PEER_SCHEMES and self.scheme not in names:
            raise ConfigError(f"scheme {self.scheme!r} runs only under pgc-train (torch.distributed workers, not "
                              f"simulated); choose one of: {', '.join(names)}")
        if self.scheme not in names:
            raise ConfigError(f"unknown scheme {self.scheme!r}; choose one of: {', '.join(names)}")
        _nonnegative_int("stragglers", self.stragglers)
        _positive_int("steps", self.steps)
        _positive("lr", self.lr)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("fr-decode", self.fr_decode, FR_DECODE_RULES)
        if self.wire_dtype is not None:
            _choice("wire-dtype", self.wire_dtype, WIRE_DTYPES)
        if not (_is_number(self.momentum) and 0 <= self.momentum < 1):
            raise ConfigError(f"--momentum must be in [0, 1), got {self.momentum!r}")
        if not isinstance(self.delay, str):
            raise ConfigError(f"--delay must be a string ({DELAY_USAGE}), got {self.delay!r}")
        check_deadline(self.deadline, self.on_deadline)
        bound = parse_max_staleness(self.max_staleness)
        _choice("on-stale", self.on_stale, ON_STALE)
        if not isinstance(self.fixed_minibatch, bool):
            raise ConfigError(f"--fixed-minibatch must be true or false, got {self.fixed_minibatch!r}")
        if not isinstance(self.adapt, bool):
            raise ConfigError(f"--adapt must be true or false, got {self.adapt!r}")
        if self.adapt and self.scheme != "pbs":
            raise ConfigError(f"--adapt applies only to pbs (its diagnostics drive it), not {self.scheme}")
        # numpy's seeded generators (partitions, minibatches, delays) reject negative seeds, torch's
        # seeds and the checkpoints' int64 attributes stop at 2**63 - 1
        _nonnegative_int("seed", self.seed)
        if self.seed > MAX_SEED:
            raise ConfigError(f"--seed must be at most 2**63 - 1 = {MAX_SEED}, got {self.seed}")
        if not _is_int(workers) or workers < 1:
            raise ConfigError(self._too_few_workers(workers))
        if self.scheme not in PEER_SCHEMES:  # ddp builds no scheme: s, c and the staleness options do not apply
            self._check_scheme_fit(workers, bound)
        DelayModel(self.delay, workers, seed=self.seed)

    def scheme_names(self) -> tuple[str, ...]:
        """The schemes this command runs: the simulated ones (pgc-train adds PEER_SCHEMES)."""
        return SCHEME_NAMES

    def _check_scheme_fit(self, workers: int, bound: int | str | None) -> None:
        """Build the scheme for `workers` (SchemeError as a ConfigError naming the worker count) and
        check the staleness bound against its pipeline depth."""
        try:
            scheme = self.make_scheme(workers)
        except ConfigError:
            raise
        except ValueError as exc:  # SchemeError: say which worker count it was checked against
            raise ConfigError(f"{exc} (with {self._describe_workers(workers)})") from None
        depth = scheme.c - 1 if scheme.kind == "coded" and scheme.pipelined else 0
        if isinstance(bound, int) and bound < depth:
            # a pipelined message always combines buffers c - 1 steps old: every one would be rejected
            raise ConfigError(f"--max-staleness {bound} is below {scheme.name}'s pipeline depth c-1 = "
                              f"{depth}: every message would be rejected and no step could complete; use at least "
                              f"{depth} (or window)")

    def make_scheme(self, workers: int) -> CodedScheme | PbsScheme:
        """The scheme these settings describe for `workers` workers (SchemeError if it does not fit)."""
        return make_scheme(self.scheme, workers, self.stragglers, seed=self.seed, c=self.c, fr_decode=self.fr_decode,
                           replication=self.replication)

    def staleness_bound(self, scheme: CodedScheme | PbsScheme) -> int | None:
        """The oldest buffer (in steps) a step may use: the scheme's window (c - 1 for pgc-*, C - 1
        for pbs, 0 for the others) with `window`, a number of steps, or None (no bound) with `none`."""
        bound = parse_max_staleness(self.max_staleness)
        return scheme.staleness_window() if bound == "window" else bound

    def refresh_over(self, scheme: CodedScheme | PbsScheme) -> int | None:
        """The staleness over which a pipelined worker refreshes its buffers before sending
        (--on-stale refresh), or None when it never does (reject, or no bound)."""
        return self.staleness_bound(scheme) if self.on_stale == "refresh" else None

    def scheme_shape(self, scheme: CodedScheme | PbsScheme) -> dict[str, Any]:
        """What the settings resolve to for this scheme, for config.json and result tables: c
        (slots per worker), the staleness bound in steps (None: none) and pbs's window C."""
        shape = {"c": scheme.c, "max_staleness_steps": self.staleness_bound(scheme), "on_stale": self.on_stale}
        if isinstance(scheme, PbsScheme):
            shape.update(replication=scheme.replication, window=scheme.table_window)
        return shape

    def _too_few_workers(self, workers: object) -> str:
        return f"--workers must be a positive integer, got {workers!r}"

    def _describe_workers(self, workers: int) -> str:
        return f"{workers} workers"

    def to_dict(self) -> dict[str, Any]:
        """The configuration as plain JSON-able values."""
        return dataclasses.asdict(self)


LOG_LEVELS = ("debug", "info", "warning")


def slurm_run_name() -> str | None:
    """The Slurm job's part of a default run folder name: `slurm<job>` or `slurm<array job>_<task>`
    (None outside Slurm). The same after a requeue, so a requeued job finds its own folder."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"slurm{array}_{task}"
    job = os.environ.get("SLURM_JOB_ID")
    return f"slurm{job}" if job else None


# Options the peer baselines (PEER_SCHEMES: torch DDP, no master in the training loop) do not support.
_NOT_WITH_PEERS = ("deadline", "checkpoint_every", "resume", "fault", "wire_dtype")


@dataclass(frozen=True)
class TrainConfig(CoreConfig):
    """Every setting of a pgc-train run (see `pgc-train --help` for what each means).

    Not validated on construction: the worker count is the MPI world size, known only on rank 0
    at run time, so call validate(workers).

    The problem is a torch `model` on a `dataset`, or, with `problem`, a synthetic one
    (pgc_mpi.learning.problems.PROBLEMS) of `samples` and `dim`. Construction fills the defaults of the
    kind chosen: model, dataset and batch_size (32) without `problem`; samples and dim with
    it, whose batch_size None means whole partitions. Options of the other kind stay None,
    so that one given explicitly is refused by validate()."""

    batch_size: int | None = None
    dataset: str | None = None
    model: str | None = None
    loss: str | None = None
    problem: str | None = None
    samples: int | None = None
    dim: int | None = None
    fault: str | None = None
    eval_every: int = 20
    target_loss: float | None = None
    out: str | None = None
    dtype: str = "float32"
    grace: float = 10.0
    poll_interval: float = 0.002
    threads: int = 1
    eval_train: bool = True
    checkpoint_every: int | None = None
    keep_checkpoints: int = 3
    resume: str | None = None
    record_params: bool = False
    verify_data: bool = True
    compute_time: float | None = None
    overwrite: bool = False
    log_interval: float = 10.0
    log_level: str = "info"
    log_dir: str | None = None
    device: str = "cpu"
    master_device: str = "cpu"
    share_gpus: bool = False
    servers: int = 1

    def __post_init__(self) -> None:
        """Fill the defaults of the kind of problem chosen (see the class docstring)."""
        if self.problem is None:
            defaults = {"model": DEFAULT_MODEL, "dataset": DEFAULT_DATASET, "batch_size": DEFAULT_BATCH_SIZE}
        else:
            defaults = SYNTHETIC_DEFAULTS
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)  # frozen: only here, while constructing

    @property
    def synthetic(self) -> bool:
        """Whether the run trains a synthetic --problem (no torch on the workers)."""
        return self.problem is not None

    def describe_problem(self) -> str:
        """The problem in words: 'quadratic (dim 1000, 1200 samples)' or 'digits/logreg'."""
        if self.synthetic:
            return f"{self.problem} (dim {self.dim}, {self.samples} samples)"
        return f"{self.dataset}/{self.model}"

    def validate(self, workers: int) -> None:
        """Check every field and the fit of the scheme to `workers` (world size - --servers)."""
        self._check_servers()
        self.validate_core(workers)
        self._check_problem()
        _positive_int("eval-every", self.eval_every)
        _positive_int("threads", self.threads)
        cores = available_cores()
        if self.threads > cores:  # torch aborts in native code when asked for a million threads
            raise ConfigError(f"--threads {self.threads} is more than the {cores} cores this process may use; "
                              f"use at most {cores} (OMP_NUM_THREADS, or the cores Slurm gives each task)")
        _choice("dtype", self.dtype, DTYPE_NAMES)
        _positive("grace", self.grace)
        _positive("poll-interval", self.poll_interval)
        if self.poll_interval > self.grace:
            raise ConfigError(f"--poll-interval {self.poll_interval:g} s is longer than --grace {self.grace:g} s: "
                              f"the end of a run could not notice its workers in time; use a poll interval of "
                              f"at most --grace (the default 0.002 s suits almost every run)")
        if self.target_loss is not None and not (_is_number(self.target_loss) and math.isfinite(self.target_loss)):
            raise ConfigError(f"--target-loss must be a finite number, got {self.target_loss}")
        if self.checkpoint_every is not None:
            _positive_int("checkpoint-every", self.checkpoint_every)
        _positive_int("keep-checkpoints", self.keep_checkpoints)
        if self.compute_time is not None:
            _positive("compute-time", self.compute_time)
        _positive("log-interval", self.log_interval)
        _choice("log-level", self.log_level, LOG_LEVELS)
        self._check_devices()
        if self.resume in ("latest", "auto") and self.out is None and not slurm_run_name():
            raise ConfigError(f"--resume {self.resume} needs --out DIR (the run directory whose checkpoints to use)")
        if self.resume is not None and self.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other: --resume continues the run in --out, "
                              "--overwrite deletes it")
        parse_faults(self.fault, workers)
        if self.scheme in PEER_SCHEMES:
            self._check_peer_options()

    def _check_servers(self) -> None:
        """--servers K: a parameter-server scheme (not ddp; pbs's followers repeat rank 0's arrivals)."""
        _positive_int("servers", self.servers)
        if self.servers > 1 and self.scheme in PEER_SCHEMES:
            raise ConfigError(f"--servers {self.servers}: --scheme {self.scheme} has no parameter server (its workers "
                              f"all-reduce); use --servers 1")

    def workers_of(self, ranks: int) -> int:
        """The workers of an MPI world of `ranks` ranks: all but the --servers (a --servers that is no
        count is validate()'s to refuse: here it counts as one)."""
        return ranks - (self.servers if _is_int(self.servers) else 1)

    def _check_devices(self) -> None:
        """--device and --master-device: known choices, and a GPU only where there is torch to use it."""
        _choice("device", self.device, DEVICE_CHOICES)
        _choice("master-device", self.master_device, DEVICE_CHOICES)
        gpu = [f"--{name.replace('_', '-')} {getattr(self, name)}" for name in ("device", "master_device")
               if getattr(self, name) != "cpu"]
        if gpu and self.synthetic:
            raise ConfigError(f"{' and '.join(gpu)}: --problem {self.problem} is computed with NumPy on the CPU; "
                              f"GPUs serve torch models (--model, --dataset)")
        if gpu and self.scheme in PEER_SCHEMES:
            raise ConfigError(f"{' and '.join(gpu)}: --scheme {self.scheme} trains on the CPU (torch.distributed's "
                              f"gloo backend) in this version; use a parameter-server scheme on GPUs")

    def scheme_names(self) -> tuple[str, ...]:
        """The simulated schemes and the peer baselines (PEER_SCHEMES), which only pgc-train runs."""
        return SCHEME_NAMES + PEER_SCHEMES

    def _check_problem(self) -> None:
        """One kind of problem, with valid options of its kind (see the class docstring)."""
        if self.batch_size is not None:  # None only with a synthetic problem: whole partitions
            _positive_int("batch-size", self.batch_size)
        if not self.synthetic:
            given = [f"--{name} {getattr(self, name)}" for name in ("dim", "samples")
                     if getattr(self, name) is not None]
            if given:
                raise ConfigError(f"{' and '.join(given)} {'applies' if len(given) == 1 else 'apply'} only to a "
                                  f"synthetic problem: give --problem ({', '.join(PROBLEMS)}) too")
            check_plugin_names(self.model, self.loss)
            return
        refuse_mixed_problem([f"--problem {self.problem}"], [f"--{name} {getattr(self, name)}" for name in
                                                             ("model", "dataset", "loss")
                                                             if getattr(self, name) is not None])
        _choice("problem", self.problem, tuple(PROBLEMS))
        _positive_int("dim", self.dim)
        _positive_int("samples", self.samples)
        if self.scheme in PEER_SCHEMES:
            raise ConfigError(f"--scheme {self.scheme} trains a torch model (torch.distributed): it does not run "
                              f"--problem {self.problem}; its equivalent on the parameter server is dgd")
        if self.problem != "quadratic" and self.samples * self.dim > MATRIX_ELEMENTS_LIMIT:
            raise ConfigError(f"--problem {self.problem} holds a --samples x --dim = {self.samples} x {self.dim} "
                              f"data matrix on every rank, more than {MATRIX_ELEMENTS_LIMIT} elements: use "
                              f"--problem quadratic (no data matrix) for large --dim")

    def _check_peer_options(self) -> None:
        """Refuse the options the ddp baseline does not implement (pgc_mpi.runtime.ddp), rather than ignore them:
        they would change what a run means. s, c, --fr-decode and the staleness options are ignored."""
        for name in _NOT_WITH_PEERS:
            if getattr(self, name) is not None:
                raise ConfigError(f"--{name.replace('_', '-')} is not supported with --scheme {self.scheme}")

    def _too_few_workers(self, workers: object) -> str:
        if self.servers > 1:
            return (f"pgc-train --servers {self.servers} needs at least {self.servers + 1} MPI ranks (ranks 0.."
                    f"{self.servers - 1} are the servers, the rest are workers): run it under mpiexec -n "
                    f"N+{self.servers} with N >= 1 workers, or use fewer --servers")
        return ("pgc-train needs at least 2 MPI ranks (rank 0 is the master, the rest are workers): run it under "
                "mpiexec -n N+1 with N >= 1 workers")

    def _describe_workers(self, workers: int) -> str:
        return f"{workers} workers = MPI world size {workers + self.servers} - {self.servers}"


@dataclass(frozen=True)
class SimConfig(CoreConfig):
    """One simulated run (pgc-sim, pgc_mpi.sim.simulator.simulate), validated on construction.

    workers: simulated workers; compute_time: simulated seconds of one partition gradient;
    target_gap: stop once the optimality gap F(w) - F* is at most this (None: run all steps);
    probe_every: steps between two probes of pbs's diagnostics (pgc-train probes at --eval-every);
    target_loss: stop once the evaluated loss (the training loss; the test loss where the
    evaluation has none) is at most this (None: run all steps); eval_every: evaluate the problem
    every this many steps and after the last one (a step record carries its metrics only then);
    master_cost: a JSON cost model of the master's own work (pgc_mpi.sim.master_cost), charged on the
    simulated clock (None: the master takes no time).
    """

    workers: int = 12
    compute_time: float = 1.0
    target_gap: float | None = None
    probe_every: int = 20  # pbs diagnostics' probes, as pgc-train's --eval-every (default 20)
    target_loss: float | None = None
    eval_every: int = 1
    master_cost: str | None = None  # a cost model file (pgc_mpi.sim.master_cost); None: the master takes no time

    def __post_init__(self) -> None:
        self.validate_core(self.workers)
        if self.master_cost is not None:
            from ..sim.master_cost import load

            load(self.master_cost)  # ConfigError now, not after the first simulated steps
        _positive("compute-time", self.compute_time)
        _positive_int("probe-every", self.probe_every)
        _positive_int("eval-every", self.eval_every)
        if self.target_gap is not None and not (_is_number(self.target_gap) and 0 <= self.target_gap < math.inf):
            raise ConfigError(f"--target-gap must be a finite number >= 0, got {self.target_gap!r}")
        if self.target_loss is not None and not (_is_number(self.target_loss) and math.isfinite(self.target_loss)):
            raise ConfigError(f"--target-loss must be a finite number, got {self.target_loss!r}")


CORE_FIELDS = tuple(f.name for f in fields(CoreConfig))


def parse_max_staleness(value: object) -> int | str | None:
    """--max-staleness as given on the command line or in TOML: `window` (the scheme's own), `none`
    (None: no bound) or a number of steps >= 0 (ConfigError otherwise)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("window", "none"):
            return None if text == "none" else "window"
        if text.isdigit():
            return int(text)
    elif _is_int(value) and value >= 0:
        return value
    raise ConfigError(f"--max-staleness must be window, none or a number of steps >= 0, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_int(name: str, value: int) -> None:
    if not _is_int(value) or value < 1:
        raise ConfigError(f"--{name} must be a positive integer, got {value!r}")


def _nonnegative_int(name: str, value: int) -> None:
    if not _is_int(value) or value < 0:
        raise ConfigError(f"--{name} must be an integer >= 0, got {value!r}")


def _positive(name: str, value: float) -> None:
    if not (_is_number(value) and math.isfinite(value) and value > 0):
        raise ConfigError(f"--{name} must be a number > 0, got {value!r}")


def _choice(name: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(f"--{name} {value!r} is not one of: {', '.join(options)}")


# One help text per field, without its default: the parsers append the default (once).
_HELP = {
    "scheme": f"straggler scheme: {', '.join(SCHEME_NAMES)}; pgc-train also runs {', '.join(PEER_SCHEMES)} (the "
              f"torch DistributedDataParallel baseline)",
    "stragglers": "s, the stragglers tolerated per step",
    "c": "partitions per worker of is-gc-fr/is-gc-cr; for pbs the staleness window C (the table steps with "
         "entries younger than C steps)",
    "replication": "pbs only: how many workers store each partition (R)",
    "steps": "training steps (model updates)",
    "lr": "learning rate",
    "optimizer": f"master's optimizer: {', '.join(OPTIMIZERS)}",
    "momentum": "momentum of --optimizer momentum",
    "delay": f"straggler injection, extra seconds per worker and step: {DELAY_USAGE}",
    "deadline": "seconds the master waits per step before --on-deadline applies",
    "on_deadline": "on a missed deadline: wait (keep waiting), partial (decode what arrived), fail",
    "max_staleness": "oldest buffer a step may use, in steps: window (the scheme's own: c-1 for pgc-*, C-1 for "
                     "pbs, 0 for the rest), a number, or none (no bound)",
    "on_stale": "pgc-* worker whose buffers are older than --max-staleness (it missed steps): refresh (recompute "
                "them at the current model before sending) or reject (send as they are; the master rejects the "
                "message until the rotation has renewed them)",
    "seed": "seed of data, model, partitions, minibatches, encoding and delays",
    "fr_decode": "when gc-fr, is-gc-fr and pgc-fr decode: covered (as soon as every group has arrived, exact "
                 "and often earlier) or n-s (after the first n-s arrivals, the paper's rule); same gradient",
    "adapt": "pbs only: halve the learning rate (down to 1/64 of it) at a diagnostics probe where the stale-error "
             "bound L^2*displacement exceeds a quarter of ||g_hat||^2",
    "fixed_minibatch": "every computation of a partition uses its first minibatch, as the authors' published code "
                       "did (it re-created the data loaders every step without shuffling); to compare with the "
                       "paper's numbers",
    "wire_dtype": f"number format of the gradient messages: {', '.join(WIRE_DTYPES)}; workers round their coded "
                  "gradient to it, the master widens and accumulates in --dtype (models travel in --dtype)",
    "batch_size": "minibatch size per partition gradient",
    "dataset": f"built-in data set ({', '.join(BUILTIN_DATASETS)}), an HDF5 file made by `python -m data_prep`, or "
               f"PATH:NAME, your data: a module (mypkg.data) or file (./data.py) and a function in it returning a "
               f"torch "
               f"Dataset or (x, y) arrays, or a (train, test) pair of them",
    "model": f"model: {', '.join(MODELS)}, or PATH:NAME, your own: a module (mypkg.nets) or file (./nets.py) and a "
             f"zero-argument function or nn.Module class in it that builds the model",
    "loss": "PATH:NAME of your loss(output, target) -> scalar tensor, the mean over the minibatch (a module or "
            "file, a colon, a function or nn.Module loss class)",
    "problem": f"train a synthetic problem instead of a torch model, and import no torch on the workers: "
               f"{', '.join(PROBLEMS)} (quadratic has no data matrix: millions of parameters, many ranks)",
    "samples": "--problem: training samples (split into the partitions)",
    "dim": "--problem: parameters",
    "fault": f"fault injection for testing: {', '.join(f'{k}:W@STEP' for k in FAULT_KINDS)} (join with +)",
    "eval_every": "evaluate on the full train and test sets every this many steps",
    "target_loss": "stop once the full training loss is at most this (--problem: the objective F(w); "
                   "quadratic's F* is 0, so that is its optimality gap)",
    "out": "output directory for config.json and metrics.jsonl",
    "dtype": f"{' or '.join(DTYPE_NAMES)} for parameters, gradients and messages",
    "grace": "seconds to wait for workers to stop at the end before abandoning hung ones",
    "poll_interval": "longest sleep in seconds between two polls of pending messages (sleeps start at 50 µs, double)",
    "threads": "torch threads per rank (with --problem: the master's only)",
    "eval_train": "evaluate on the full training split too (--no-eval-train: test split only; "
                  "--target-loss then uses the recent minibatch losses; no effect with --problem)",
    "checkpoint_every": "write a checkpoint (OUT/checkpoints) every this many steps, at the end and when stopped "
                        "by a signal",
    "keep_checkpoints": "how many checkpoints to keep",
    "resume": "continue a run: 'auto' (from the newest checkpoint in --out if there is one, else start afresh), "
              "'latest' (the newest checkpoint in --out; an error if none) or a checkpoint file; the folder's "
              "config.json must describe the same run",
    "overwrite": "delete the outputs of the run already in --out before starting (without it, and without "
                 "--resume, a folder holding a run is refused)",
    "log_interval": "seconds between two progress lines in the log (a live one-line display instead on a terminal)",
    "log_level": f"log level of every rank: {', '.join(LOG_LEVELS)}",
    "log_dir": "also write each rank's log to DIR/rank-<r>.log (for post-mortems)",
    "record_params": "also write params.npy with the parameters after every step (small models only)",
    "compute_time": "emulate a cluster's compute: every partition gradient takes at least this many seconds (the "
                    "real gradient is computed and the rest slept), so ranks sharing cores behave like nodes",
    "device": "where the workers compute their gradients: cpu, cuda (a GPU per worker, chosen by its rank on its "
              "node: see the README) or auto (cuda where a GPU is visible)",
    "master_device": "where the master evaluates the model: cpu, cuda or auto (decoding and the optimizer step "
                     "stay on the CPU in this version)",
    "servers": "parameter servers K: ranks 0..K-1 each hold, decode and update one contiguous shard of the "
               "parameters (rank 0 also evaluates, logs and checkpoints; with pbs it also decides the order of the "
               "arrivals, which the others repeat); the workers are ranks K and up; not with ddp",
    "share_gpus": "let several ranks of a node use the same GPU when there are more ranks that want one than GPUs "
                  "(otherwise an error)",
    "verify_data": "check the data file's sha256 checksum when opening it (--no-verify-data skips it; labels "
                   "and values are always checked; no effect with --problem)",
}

# How a None default reads in the help ("none" unless said here).
_NONE_DEFAULT = {
    "batch_size": f"{DEFAULT_BATCH_SIZE}; with --problem the whole partition",
    "dataset": f"{DEFAULT_DATASET}, unless --problem",
    "model": f"{DEFAULT_MODEL}, unless --problem",
    "loss": "cross-entropy for integer labels, half the mean squared error for floating-point targets",
    "problem": "none, a torch --model on a --dataset",
    "samples": f"{SYNTHETIC_DEFAULTS['samples']} with --problem",
    "dim": f"{SYNTHETIC_DEFAULTS['dim']} with --problem",
    "c": "s+1; is-gc-*: 2; pbs: the replication",
    "replication": "2",
    "deadline": "no deadline",
    "target_loss": "none, run all --steps",
    "out": "runs/<scheme>-slurm<job id>[_<task>] under Slurm, else runs/<scheme>-<UTC time>-<random>",
    "checkpoint_every": "none, only when stopped by a signal or asked for",
    "resume": "none, start afresh",
    "log_dir": "none, standard error only",
    "compute_time": "none, as long as it takes",
    "wire_dtype": "--dtype; pgc-sim: float64, nothing rounded",
}


def show_default(name: str, value: Any) -> str:
    """How the default `value` of option `name` reads in a help text: '(default: ...)'."""
    if value is None:
        shown = _NONE_DEFAULT.get(name, "none")
    elif isinstance(value, bool):
        shown = "on" if value else "off"
    else:
        shown = str(value)
    return f"(default: {shown})"


def _add_field_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, config_fields: Iterable[Field],
                       defaults: Mapping[str, Any], fill_defaults: bool) -> None:
    for f in config_fields:
        flag = "--" + f.name.replace("_", "-")
        names = ["-s", flag] if f.name == "stragglers" else [flag]
        default = defaults.get(f.name, f.default)
        # argparse %-formats help texts: a literal % (none today) must not break --help
        help_text = f"{_HELP[f.name]} {show_default(f.name, default)}".replace("%", "%%")
        # without fill_defaults an option not given parses to None, so that a TOML file can fill it
        parsed_default = default if fill_defaults else None
        if f.type == "bool":
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, default=parsed_default,
                                help=help_text)
        else:
            parser.add_argument(*names, type=_arg_type(f.type), default=parsed_default, metavar=f.name.upper(),
                                help=help_text)


def add_core_options(parser: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None, *,
                     fill_defaults: bool = True, skip: Iterable[str] = (),
                     title: str = "shared options (the same in pgc-train and pgc-sim)") -> None:
    """Add the options of CoreConfig's fields (--scheme, -s/--stragglers, --c, --steps, --lr, ...)
    to `parser`, in one group, with the same flags and help texts in every command.

    `defaults` overrides a field's default for this command (shown in the help and, with
    fill_defaults, parsed); without fill_defaults an option not given parses to None. `skip`
    leaves fields out (pgc-sim has --schemes instead of --scheme).
    """
    defaults = dict(defaults or {})
    unknown = set(defaults) - set(CORE_FIELDS)
    if unknown:
        raise ValueError(f"not core fields: {sorted(unknown)}")
    group = parser.add_argument_group(title)
    chosen = [f for f in fields(CoreConfig) if f.name not in set(skip)]
    _add_field_options(group, chosen, defaults, fill_defaults)


def build_parser(prog: str = "pgc-train") -> argparse.ArgumentParser:
    """The pgc-train argument parser; every option defaults to None so a TOML file can fill it."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Train a model on an MPI parameter server with a straggler-tolerant scheme. "
                    "Rank 0 is the master, ranks 1..N are workers: mpiexec -n N+1 pgc-train [options]",
    )
    p.add_argument("--config", type=Path, default=None,
                   help="TOML file with any of these options (keys spelled like the flags); flags given too "
                        "override it (default: none)")
    add_core_options(p, fill_defaults=False)
    training = p.add_argument_group("training options")
    _add_field_options(training, [f for f in fields(TrainConfig) if f.name not in CORE_FIELDS], {},
                       fill_defaults=False)
    return p


def _int_or_word(text: str) -> int | str:
    """A flag that takes a number or a word (--max-staleness 3, window, none): checked when validated."""
    return int(text) if text.strip().isdigit() else text


def _arg_type(annotation: str):
    if annotation == "int | str":
        return _int_or_word
    if "int" in annotation:
        return int
    if "float" in annotation:
        return float
    return str


def _coerce(name: str, value: Any, annotation: str, what: str = "config key") -> Any:
    """Check a TOML value's (or a keyword's, `what`) type against the field's annotation."""
    optional = "None" in annotation
    if value is None and optional:
        return None
    if annotation.startswith("bool"):
        ok = isinstance(value, bool)
    elif annotation == "int | str":
        ok = _is_int(value) or isinstance(value, str)
    elif annotation.startswith("int"):
        ok = _is_int(value)
    elif annotation.startswith("float"):
        ok = _is_number(value)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        want = annotation.split(" ")[0]
        raise ConfigError(f"{what} {name!r} must be of type {want}, got {value!r}")
    return value


def load_toml(path: Path) -> dict[str, Any]:
    """Options from a TOML file (keys with - or _), checked for unknown keys and types."""
    try:
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc.strerror})") from None
    types = {f.name: f.type for f in fields(TrainConfig)}
    out = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in types:
            raise ConfigError(f"--config {path}: unknown key {key!r}; valid keys: {', '.join(sorted(types))}")
        out[name] = _coerce(key, value, types[name])
    return out


def config_from_options(options: Mapping[str, Any], where: str = "pgc_mpi.fit") -> TrainConfig:
    """A TrainConfig from keywords named like its fields (pgc_mpi.fit's), checked for unknown names
    and types as a TOML file's keys are (`config` names a TOML file whose values they override);
    not yet validated against a world size."""
    types = {f.name: f.type for f in fields(TrainConfig)}
    values: dict[str, Any] = {}
    if options.get("config") is not None:
        values.update(load_toml(Path(options["config"])))
    for name, value in options.items():
        if name == "config":
            continue
        if name not in types:
            raise ConfigError(f"{where}: unknown option {name!r}; the options are pgc-train's, spelled with _: "
                              f"{', '.join(sorted(types))}")
        values[name] = _coerce(name, value, types[name], f"{where} option")
    return TrainConfig(**values)


def options_from_args(argv: list[str] | None = None, **defaults: Any) -> dict[str, Any]:
    """pgc_mpi.fit's options from a script's command line (sys.argv[1:]): pgc-train's flags, parsed
    by its parser, over `defaults`; so that `mpiexec -n 5 python mine.py --steps 50 --resume auto`
    and a batch script's flags work as with pgc-train. A bad flag: argparse's error, exit status 2."""
    parser = build_parser(prog=Path(sys.argv[0]).name or "script")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return {**defaults, **{k: v for k, v in vars(args).items() if v is not None}}


def config_from_args(argv: list[str]) -> TrainConfig:
    """Defaults, then the TOML file, then the flags; not yet validated against a world size."""
    parser = build_parser()
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    if args.config is not None:
        values.update(load_toml(args.config))
    values.update({k: v for k, v in vars(args).items() if v is not None and k != "config"})
    return TrainConfig(**values)
