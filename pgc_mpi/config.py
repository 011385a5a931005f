"""The training run's configuration: one frozen dataclass, filled from flags and a TOML file.

Precedence: built-in defaults < --config FILE.toml < command-line flags. Everything is validated
once, here, with messages that say what to change.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .collector import check_deadline
from .datasets import BUILTIN
from .errors import ConfigError
from .faults import parse_faults
from .models import DTYPES, MODELS
from .optim import OPTIMIZERS
from .schemes import SCHEME_NAMES, make_scheme
from .stragglers import DelayModel


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a pgc-train run (see `pgc-train --help` for what each means)."""

    scheme: str = "pgc-cr"
    stragglers: int = 1
    c: int | None = None
    steps: int = 200
    lr: float = 0.5
    optimizer: str = "sgd"
    momentum: float = 0.9
    batch_size: int = 32
    dataset: str = "digits"
    model: str = "logreg"
    seed: int = 0
    deadline: float | None = None
    on_deadline: str = "wait"
    max_staleness: int | None = None
    delay: str = "none"
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

    def validate(self, workers: int) -> None:
        """Check every field and the fit of the scheme to `workers` (world size - 1)."""
        if self.scheme not in SCHEME_NAMES:
            raise ConfigError(f"unknown scheme {self.scheme!r}; choose one of: {', '.join(SCHEME_NAMES)}")
        _positive_int("steps", self.steps)
        _positive_int("batch-size", self.batch_size)
        _positive_int("eval-every", self.eval_every)
        _positive_int("threads", self.threads)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("model", self.model, MODELS)
        _choice("dtype", self.dtype, tuple(DTYPES))
        _positive("lr", self.lr)
        _positive("grace", self.grace)
        _positive("poll-interval", self.poll_interval)
        check_deadline(self.deadline, self.on_deadline)
        if self.target_loss is not None and not math.isfinite(self.target_loss):
            raise ConfigError(f"--target-loss must be a finite number, got {self.target_loss}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"--momentum must be in [0, 1), got {self.momentum}")
        if self.checkpoint_every is not None:
            _positive_int("checkpoint-every", self.checkpoint_every)
        _positive_int("keep-checkpoints", self.keep_checkpoints)
        if self.resume == "latest" and self.out is None:
            raise ConfigError("--resume latest needs --out DIR (the run directory whose checkpoints to use)")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError(f"--max-staleness must be >= 0, got {self.max_staleness}")
        if workers < 1:
            raise ConfigError("pgc-train needs at least 2 MPI ranks (rank 0 is the master, the rest are "
                              "workers): run it under mpiexec -n N+1 with N >= 1 workers")
        try:
            make_scheme(self.scheme, workers, self.stragglers, seed=self.seed, c=self.c)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{exc} (with {workers} workers = MPI world size {workers + 1} - 1)") from None
        DelayModel(self.delay, workers, seed=self.seed)
        parse_faults(self.fault, workers)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as plain JSON-able values."""
        return dataclasses.asdict(self)


def _positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"--{name} must be a positive integer, got {value!r}")


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(f"--{name} must be a number > 0, got {value!r}")


def _choice(name: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(f"--{name} {value!r} is not one of: {', '.join(options)}")


_HELP = {
    "scheme": f"straggler scheme: {', '.join(SCHEME_NAMES)}",
    "stragglers": "s, the stragglers tolerated per step",
    "c": "partitions per worker for is-gc-fr/is-gc-cr (default s+1)",
    "steps": "training steps (model updates)",
    "lr": "learning rate",
    "optimizer": f"master's optimizer: {', '.join(OPTIMIZERS)}",
    "momentum": "momentum of --optimizer momentum",
    "batch_size": "minibatch size per partition gradient",
    "dataset": f"built-in data set ({', '.join(BUILTIN)}) or an HDF5 file made by `python -m data_prep`",
    "model": f"model: {', '.join(MODELS)}",
    "seed": "seed of model, partitions, minibatches, encoding and delays",
    "deadline": "seconds the master waits per step before --on-deadline applies (default: no deadline)",
    "on_deadline": "on a missed deadline: wait (keep waiting), partial (decode what arrived), fail",
    "max_staleness": "reject messages whose oldest buffer is older than this many steps",
    "delay": "straggler injection: none, exp:MEAN, fixed:W1,W2:SEC, random:K:SEC, hang:W@STEP (join with +)",
    "fault": "fault injection for testing: nan:W@STEP, inf:W@STEP, badsize:W@STEP, die:W@STEP (join with +)",
    "eval_every": "evaluate on the full train and test sets every this many steps",
    "target_loss": "stop once the full training loss is at most this",
    "out": "output directory for config.json and metrics.jsonl (default runs/<scheme>-<time>)",
    "dtype": "float32 or float64 for parameters, gradients and messages",
    "grace": "seconds to wait for workers to stop at the end before abandoning hung ones",
    "poll_interval": "longest sleep in seconds between two polls of pending messages (sleeps start at 50 µs, double)",
    "threads": "torch threads per rank",
    "eval_train": "evaluate on the full training split too (--no-eval-train: test split only; "
                  "--target-loss then uses the recent minibatch losses)",
    "checkpoint_every": "write a checkpoint (OUT/checkpoints) every this many steps, at the end and when stopped "
                        "by a signal",
    "keep_checkpoints": "how many checkpoints to keep",
    "resume": "continue from a checkpoint: a file, or 'latest' in --out's checkpoints",
    "record_params": "also write params.npy with the parameters after every step (small models only)",
}


def build_parser() -> argparse.ArgumentParser:
    """The pgc-train argument parser; every option defaults to None so a TOML file can fill it."""
    p = argparse.ArgumentParser(
        prog="pgc-train",
        description="Train a model on an MPI parameter server with a straggler-tolerant scheme. "
                    "Rank 0 is the master, ranks 1..N are workers: mpiexec -n N+1 pgc-train [options]",
    )
    p.add_argument("--config", type=Path, default=None, help="TOML file with any of these options")
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        names = [flag, "-s"] if f.name == "stragglers" else [flag]
        help_text = f"{_HELP[f.name]} (default: {getattr(defaults, f.name)})"
        if f.type == "bool":
            p.add_argument(*names, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            p.add_argument(*names, type=_arg_type(f.type), default=None, metavar=f.name.upper(), help=help_text)
    return p


def _arg_type(annotation: str):
    if "int" in annotation:
        return int
    if "float" in annotation:
        return float
    return str


def _coerce(name: str, value: Any, annotation: str) -> Any:
    """Check a TOML value's type against the field's annotation."""
    optional = "None" in annotation
    if value is None and optional:
        return None
    if annotation.startswith("bool"):
        ok = isinstance(value, bool)
    elif annotation.startswith("int"):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation.startswith("float"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        want = annotation.split(" ")[0]
        raise ConfigError(f"config key {name!r} must be of type {want}, got {value!r}")
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
    types = {f.name: f.type for f in fields(TrainConfig)}
    out = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in types:
            raise ConfigError(f"--config {path}: unknown key {key!r}; valid keys: {', '.join(sorted(types))}")
        out[name] = _coerce(key, value, types[name])
    return out


def config_from_args(argv: list[str]) -> TrainConfig:
    """Defaults, then the TOML file, then the flags; not yet validated against a world size."""
    parser = build_parser()
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    if args.config is not None:
        values.update(load_toml(args.config))
    values.update({k: v for k, v in vars(args).items() if v is not None and k != "config"})
    return TrainConfig(**values)
