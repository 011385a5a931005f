"""The configuration core: what pgc-train and pgc-sim share (CoreConfig: scheme, s, c, steps,
optimizer, delays, deadline, seed), with one set of defaults and one validation, and the checks
every configuration uses. Imports neither torch nor mpi4py."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, fields
from typing import Any

from ..choices import DEADLINE_POLICIES, LR_SCHEDULES, MODELS, OPTIMIZERS
from ..core.abandon import abandons
from ..core.age_weights import DEFAULT_CORRECTION, applied_correction, parse_correction
from ..core.drop_compute import AUTO
from ..core.sampling import parse_partitioning
from ..core.schemes import FR_DECODE_RULES, ON_STALE, CodedScheme, PbsScheme, make_scheme
from ..core.stragglers import USAGE as DELAY_USAGE
from ..core.stragglers import DelayModel
from ..core.traits import PEER_SCHEMES, SCHEME_NAMES, schemes_with
from ..core.wire import WIRE_DTYPES
from ..errors import ConfigError
from ..learning.plugins import is_spec


def check_deadline(deadline: float | None, policy: str) -> None:
    """Raise ConfigError unless `deadline` is None or a number > 0 and `policy` is a known one
    (the same rule for pgc-train's and the simulator's configurations)."""
    if deadline is not None and not (_is_number(deadline) and math.isfinite(deadline) and deadline > 0):
        raise ConfigError(f"--deadline must be a number > 0, got {deadline!r}")
    if policy not in DEADLINE_POLICIES:
        raise ConfigError(f"--on-deadline {policy!r} is not one of: {', '.join(DEADLINE_POLICIES)}")


MAX_SEED = 2**63 - 1


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
    partitioning: str = "iid"
    staleness_correction: str = DEFAULT_CORRECTION
    wire_dtype: str | None = None
    # the training recipe (pgc_mpi.learning.optim.Recipe): the same in pgc-train and pgc-sim
    weight_decay: float = 0.0
    betas: str = "0.9,0.999"
    eps: float = 1e-8
    lr_schedule: str = "constant"
    scheduler: str | None = None  # PATH:NAME of a factory optimizer -> LRScheduler (instead of lr_schedule)
    warmup_steps: int = 0
    min_lr: float = 0.0
    lr_milestones: str | None = None
    lr_gamma: float = 0.1
    clip_grad_norm: float | None = None
    accumulate: int = 1
    abandon_late: bool = False
    drop_compute: float | str | None = None

    def abandons_late(self) -> bool:
        """Whether workers drop decided jobs: --abandon-late with a scheme that may (pgc_mpi.core.abandon)."""
        return self.abandon_late and abandons(self.scheme)

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
        self._check_optimizer()
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
        parse_partitioning(self.partitioning)
        parse_correction(self.staleness_correction)
        if not isinstance(self.fixed_minibatch, bool):
            raise ConfigError(f"--fixed-minibatch must be true or false, got {self.fixed_minibatch!r}")
        if not isinstance(self.abandon_late, bool):
            raise ConfigError(f"--abandon-late must be true or false, got {self.abandon_late!r}")
        if not isinstance(self.adapt, bool):
            raise ConfigError(f"--adapt must be true or false, got {self.adapt!r}")
        if self.adapt and self.scheme not in schemes_with("table"):
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

    def _check_optimizer(self) -> None:
        """The recipe's fields: the optimizer, its hyper-parameters, the schedule, clipping, accumulation."""
        if not (self.optimizer in OPTIMIZERS or is_spec(self.optimizer)):
            raise ConfigError(f"--optimizer {self.optimizer!r} is not one of: {', '.join(OPTIMIZERS)} or PATH:NAME "
                              f"(a factory model -> torch.optim.Optimizer)")
        if not (_is_number(self.weight_decay) and math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"--weight-decay must be a number >= 0, got {self.weight_decay!r}")
        betas = _floats("betas", self.betas)
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ConfigError(f"--betas must be two numbers in [0, 1) separated by a comma (e.g. 0.9,0.999), "
                              f"got {self.betas!r}")
        _positive("eps", self.eps)
        _choice("lr-schedule", self.lr_schedule, LR_SCHEDULES)
        _nonnegative_int("warmup-steps", self.warmup_steps)
        if not (_is_number(self.min_lr) and 0 <= self.min_lr <= (self.lr if _is_number(self.lr) else math.inf)):
            raise ConfigError(f"--min-lr must be a number in [0, --lr], got {self.min_lr!r}")
        if self.lr_schedule == "step":
            milestones = _floats("lr-milestones", self.lr_milestones or "")
            if not milestones or any(m != int(m) or m < 1 for m in milestones) or list(milestones) != sorted(
                    set(milestones)):
                raise ConfigError(f"--lr-schedule step needs --lr-milestones: increasing step numbers >= 1 "
                                  f"separated by commas (e.g. 300,600), got {self.lr_milestones!r}")
        elif self.lr_milestones is not None:
            raise ConfigError(f"--lr-milestones applies to --lr-schedule step, not {self.lr_schedule}: leave it out "
                              f"or use --lr-schedule step")
        if not (_is_number(self.lr_gamma) and 0 < self.lr_gamma <= 1):
            raise ConfigError(f"--lr-gamma must be a number in (0, 1], got {self.lr_gamma!r}")
        if self.clip_grad_norm is not None:
            _positive("clip-grad-norm", self.clip_grad_norm)
        _positive_int("accumulate", self.accumulate)
        if self.drop_compute is not None:
            self._check_drop_compute()
        if self.scheduler is not None:
            self._check_scheduler()
        if self.adapt and (self.lr_schedule != "constant" or self.warmup_steps):
            raise ConfigError(f"--adapt and --lr-schedule {self.lr_schedule}"
                              f"{f' --warmup-steps {self.warmup_steps}' if self.warmup_steps else ''} both set the "
                              f"learning rate: use one of them (pbs's --adapt with a constant --lr)")

    def _check_scheduler(self) -> None:
        if not is_spec(self.scheduler):
            raise ConfigError(f"--scheduler {self.scheduler!r} is not PATH:NAME (a module or file, a colon, and "
                              f"a factory optimizer -> torch LRScheduler in it)")
        if self.lr_schedule != "constant" or self.warmup_steps:
            raise ConfigError(f"--scheduler {self.scheduler} and --lr-schedule {self.lr_schedule}"
                              f"{' / --warmup-steps' if self.warmup_steps else ''} both set the learning rate: "
                              f"give one of them")
        if self.adapt:
            raise ConfigError("--adapt and --scheduler both set the learning rate: use one of them")

    def _check_drop_compute(self) -> None:
        if self.drop_compute != AUTO and not (_is_number(self.drop_compute) and math.isfinite(self.drop_compute)
                                              and self.drop_compute > 0):
            raise ConfigError(f"--drop-compute must be a number of seconds > 0, or {AUTO} (chosen from the first "
                              f"steps' jobs), got {self.drop_compute!r}")
        droppers = schemes_with("drops_compute")
        if self.scheme not in droppers:
            raise ConfigError(f"--drop-compute applies to {' and '.join(droppers)} (DropCompute shortens the jobs "
                              f"they wait for), "
                              f"not {self.scheme}: its stragglers are skipped already; --abandon-late drops their "
                              f"decided jobs")
        if self.accumulate < 2:
            raise ConfigError(f"--drop-compute {self.drop_compute} stops a job between its micro-batches: give "
                              f"--accumulate K >= 2 (K micro-batches per gradient)")

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
                           replication=self.replication, staleness_correction=self.staleness_correction)

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
        (slots per worker), the staleness bound in steps (None: none), the staleness correction the
        scheme applies (`none` where it has no stale buffers) and pbs's window C."""
        shape = {"c": scheme.c, "max_staleness_steps": self.staleness_bound(scheme), "on_stale": self.on_stale,
                 "staleness_correction": applied_correction(scheme.name, self.staleness_correction)}
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


def _floats(name: str, text: object) -> tuple[float, ...]:
    """Numbers separated by commas (--betas, --lr-milestones), or ConfigError."""
    try:
        return tuple(float(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"--{name} must be numbers separated by commas, got {text!r}") from None


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
