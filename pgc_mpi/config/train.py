"""pgc-train's configuration (TrainConfig), from a TOML file (load_toml) or pgc_mpi.fit's keywords
(config_from_options), with the same names, types and checks; the command line is in
pgc_mpi.config.options. Not validated on construction: the worker count is known at run time."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..choices import AUTOCAST, DEVICE_CHOICES, DTYPE_NAMES
from ..core.faults import parse_faults
from ..core.sampling import needs_labels, refuse_unlabelled
from ..core.traits import PEER_SCHEMES, SCHEME_NAMES
from ..errors import ConfigError
from ..learning.plugins import is_spec
from ..learning.problems import PROBLEMS
from .core import (
    CoreConfig,
    _choice,
    _is_int,
    _is_number,
    _positive,
    _positive_int,
    available_cores,
    check_plugin_names,
    refuse_mixed_problem,
)

# pgc-train's problem: a torch model on a data set (these defaults), or a synthetic --problem with
# SYNTHETIC_DEFAULTS (pgc-sim's, and the same option names); TrainConfig resolves which.
DEFAULT_MODEL, DEFAULT_DATASET, DEFAULT_BATCH_SIZE = "logreg", "digits", 32
SYNTHETIC_DEFAULTS = {"samples": 1200, "dim": 20}
# least-squares and logistic hold a samples x dim data matrix (float64) on every rank: pgc-train
# refuses more elements than this (128 MiB); quadratic holds none
MATRIX_ELEMENTS_LIMIT = 2**24


LOG_LEVELS = ("debug", "info", "warning")
# --loader-workers auto for a torch Dataset whose reads are slow enough (pgc_mpi.learning.minibatches:
# WORTH_LOADING): two loader processes per worker hide a minibatch's read behind a step (one
# loads the next job's minibatch while the other finishes a dropped or the current one, and two
# reads at once halve a read longer than a step); more only help when one read takes longer than
# two steps (docs/BENCHMARKS.md §27)
AUTO_LOADERS = 2


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
    lost_after: float = 60.0
    poll_interval: float = 0.002
    threads: int = 1
    eval_train: bool = True
    checkpoint_every: int | None = None
    keep_checkpoints: int = 3
    resume: str | None = None
    resume_other_data: bool = False
    record_params: bool = False
    verify_data: bool = True
    memory_check: bool = True
    compute_time: float | None = None
    loader_workers: int | str = "auto"
    prefetch: int = 2
    overwrite: bool = False
    log_interval: float = 10.0
    log_level: str = "info"
    log_dir: str | None = None
    device: str = "cpu"
    master_device: str = "cpu"
    share_gpus: bool = False
    servers: int = 1
    autocast: str = "none"
    early_stop: str | None = None
    keep_best: str | None = None
    csv_log: str | None = None
    tensorboard: str | None = None

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
        if self.synthetic and needs_labels(self.partitioning):
            refuse_unlabelled(self.partitioning, f"the synthetic --problem {self.problem}")
        _positive_int("eval-every", self.eval_every)
        _positive_int("threads", self.threads)
        cores = available_cores()
        if self.threads > cores:  # torch aborts in native code when asked for a million threads
            raise ConfigError(f"--threads {self.threads} is more than the {cores} cores this process may use; "
                              f"use at most {cores} (OMP_NUM_THREADS, or the cores Slurm gives each task)")
        _choice("dtype", self.dtype, DTYPE_NAMES)
        _positive("grace", self.grace)
        _positive("lost_after", self.lost_after)
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
        self._check_loading()
        _positive("log-interval", self.log_interval)
        _choice("log-level", self.log_level, LOG_LEVELS)
        self._check_devices()
        if self.resume in ("latest", "auto") and self.out is None and not slurm_run_name():
            raise ConfigError(f"--resume {self.resume} needs --out DIR (the run directory whose checkpoints to use)")
        if self.resume is not None and self.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other: --resume continues the run in --out, "
                              "--overwrite deletes it")
        parse_faults(self.fault, workers, elastic=self.resume is not None)  # strict on a fresh start: _configure
        self._check_recipe()
        if self.scheme in PEER_SCHEMES:
            self._check_peer_options()

    def _check_loading(self) -> None:
        if self.loader_workers != "auto" and not (isinstance(self.loader_workers, int)
                                                  and not isinstance(self.loader_workers, bool)
                                                  and self.loader_workers >= 0):
            raise ConfigError(f"--loader-workers must be a whole number >= 0 (0: each worker reads its own "
                              f"minibatches) or auto, got {self.loader_workers!r}")
        if not (isinstance(self.prefetch, int) and not isinstance(self.prefetch, bool) and self.prefetch >= 0):
            raise ConfigError(f"--prefetch must be a whole number >= 0 (the jobs whose minibatches are loaded ahead), "
                              f"got {self.prefetch!r}")

    def loader_processes(self, lazy: bool) -> int:
        """A worker's loader processes (pgc_mpi.learning.prefetch) for a data source that is `lazy`
        (a torch Dataset, read a minibatch at a time): --loader-workers, where auto means
        AUTO_LOADERS for a Dataset and none for held rows (arrays, HDF5, the built-ins: a
        minibatch of them is a slice of memory, with nothing to hide)."""
        if not lazy or self.synthetic:
            return 0
        return AUTO_LOADERS if self.loader_workers == "auto" else int(self.loader_workers)

    def _check_recipe(self) -> None:
        """What pgc-train adds to the recipe (CoreConfig checks the rest): autocast, accumulation's
        minibatches, the built-in callbacks, and what --servers K allows."""
        from .callback_specs import parse_early_stop, parse_keep_best

        _choice("autocast", self.autocast, AUTOCAST)
        if self.autocast != "none" and self.synthetic:
            raise ConfigError(f"--autocast {self.autocast}: --problem {self.problem} is computed with NumPy; autocast "
                              f"applies to torch models")
        if self.autocast == "fp16" and self.device != "cuda":
            raise ConfigError(f"--autocast fp16 needs --device cuda (float16 autocast with its loss scale is for GPUs; "
                              f"got --device {self.device}): use --autocast bf16 on CPUs")
        if self.accumulate > 1 and self.batch_size is None:
            raise ConfigError(f"--accumulate {self.accumulate} averages micro-batches of --batch-size: give "
                              f"--batch-size (without it every gradient is of the whole partition)")
        if self.servers > 1 and is_spec(self.optimizer):
            raise ConfigError(f"--optimizer {self.optimizer} with --servers {self.servers}: a user's optimizer may "
                              f"need whole tensors and param groups, which shards cut; use --servers 1, or a "
                              f"built-in optimizer (element-wise: each server steps its shard)")
        if self.servers > 1 and self.clip_grad_norm is not None:
            raise ConfigError(f"--clip-grad-norm with --servers {self.servers}: clipping by the global norm is not "
                              f"supported with several servers in this version; use --servers 1")
        if self.early_stop is not None:
            parse_early_stop(self.early_stop)
        if self.keep_best is not None:
            parse_keep_best(self.keep_best)
            if self.scheme in PEER_SCHEMES:
                raise ConfigError(f"--keep-best writes checkpoints, which --scheme {self.scheme} does not have")
        for name in ("csv_log", "tensorboard"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ConfigError(f"--{name.replace('_', '-')} must be a path, got {getattr(self, name)!r}")

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
    elif annotation.startswith("float | str"):
        ok = _is_number(value) or isinstance(value, str)
        value = float(value) if _is_number(value) else value
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
