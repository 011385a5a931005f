"""The command line: the help text of every option, and the parsers' option groups built from the
configuration's fields (pgc-train's parser here; pgc-sim adds the shared group and its own), so
that names, defaults and help agree everywhere; options_from_args gives pgc_mpi.fit a script's flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from dataclasses import Field, fields
from pathlib import Path
from typing import Any

from ..choices import AUTOCAST, BUILTIN_DATASETS, DTYPE_NAMES, LR_SCHEDULES, MODELS, OPTIMIZERS
from ..core.age_weights import CORRECTION_USAGE
from ..core.faults import KINDS as FAULT_KINDS
from ..core.sampling import PARTITIONING_USAGE
from ..core.stragglers import USAGE as DELAY_USAGE
from ..core.traits import PEER_SCHEMES, SCHEME_NAMES
from ..core.wire import WIRE_DTYPES
from ..learning.problems import PROBLEMS
from .core import CORE_FIELDS, CoreConfig
from .train import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_DATASET,
    DEFAULT_MODEL,
    LOG_LEVELS,
    SYNTHETIC_DEFAULTS,
    TrainConfig,
    load_toml,
)

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
    "optimizer": f"master's optimizer: {', '.join(OPTIMIZERS)}, or PATH:NAME, your factory model -> "
                 f"torch.optim.Optimizer (param groups welcome), called once on the master (pgc-sim: on a torch "
                 f"model)",
    "momentum": "momentum of --optimizer momentum and nesterov",
    "weight_decay": "weight decay of the built-in optimizers (adamw: decoupled), on every parameter (for weights "
                    "only, give a factory with param groups)",
    "betas": "adam and adamw: beta1,beta2",
    "eps": "adam and adamw: epsilon",
    "lr_schedule": f"learning-rate schedule over --steps updates: {', '.join(LR_SCHEDULES)} (cosine and linear "
                   f"decay to --min-lr at the last step; step multiplies by --lr-gamma at each of --lr-milestones)",
    "warmup_steps": "linear warm-up from lr/W to lr over the first W updates, before the schedule",
    "min_lr": "the learning rate cosine and linear decay to",
    "lr_milestones": "--lr-schedule step: the updates at which the rate is multiplied by --lr-gamma (e.g. 300,600)",
    "lr_gamma": "--lr-schedule step: the factor at each milestone",
    "clip_grad_norm": "clip the decoded gradient to this global L2 norm before the optimizer (the norm before "
                      "clipping is in every step record as grad_norm)",
    "abandon_late": "a worker whose step the master has decided without it stops at its next check point (after "
                    "a forward pass, between micro-batches) and takes the newest model, instead of finishing a "
                    "message that would be discarded (schemes other than dgd, ddp and pbs; docs/ALGORITHMS.md §11)",
    "drop_compute": "DropCompute (dgd, ddp): a worker starts no more micro-batches once its job has run this "
                    "many seconds and sends those done; the step averages over the micro-batches computed (needs "
                    "--accumulate >= 2); auto: the threshold computing the most micro-batches per second over "
                    "steps 1-20 (docs/ALGORITHMS.md §12)",
    "accumulate": "each partition gradient is the mean over this many micro-batches of --batch-size (a larger "
                  "minibatch at the same memory)",
    "scheduler": "PATH:NAME of your factory optimizer -> torch LRScheduler, stepped once per update (instead of "
                 "--lr-schedule)",
    "autocast": f"mixed precision of the workers' forward and backward: {', '.join(AUTOCAST)} (torch.autocast; "
                f"fp16 on --device cuda only, with a loss scale per gradient); gradients leave in --dtype",
    "early_stop": "stop when an evaluated metric stops improving: METRIC:PATIENCE[:MODE[:MIN_DELTA]] (e.g. "
                  "test_accuracy:5; patience in evaluations; mode min, max or auto)",
    "keep_best": "keep the checkpoint with the best METRIC[:MODE] as OUT/checkpoints/best.h5 (pgc-export "
                 "--checkpoint best)",
    "csv_log": "also write every evaluation as a row of this CSV file",
    "tensorboard": "also write TensorBoard event files (loss, lr, grad norm, evaluations) into this folder, on the "
                   "node (needs the [tensorboard] extra)",
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
    "partitioning": f"how the training data is cut into the n partitions: {PARTITIONING_USAGE}; iid: a seeded "
                    f"uniform random split; by-label: the samples sorted by class before the cut (each partition "
                    f"holds one or two classes); dirichlet:ALPHA: each partition's class mix drawn from a "
                    f"Dirichlet(ALPHA), seeded (small ALPHA: skewed); the last two need a classification data set "
                    f"(docs/data.md)",
    "staleness_correction": f"how pgc-fr and pgc-cr weigh their buffers: {CORRECTION_USAGE}; weights:R weighs a "
                            f"buffer of age a in the rotation by R**a (scaled so a message's weights sum to c: every "
                            f"gradient keeps its total weight; R=0 sends the fresh gradient alone); other schemes "
                            f"ignore it (docs/ALGORITHMS.md §13)",
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
    "lost_after": "seconds without a heartbeat or message from a worker before it is declared lost (its process "
                  "or node gone or frozen: a worker_lost event; a slow worker keeps sending heartbeats, and one "
                  "heard again comes back: worker_back); coded schemes go on without it, and a step that needs a "
                  "lost worker (dgd, more than s lost) ends the run with a checkpoint and exit status 5, to be "
                  "resumed on the workers that are left",
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
    "resume_other_data": "let --resume continue the run on other data than it was trained on (otherwise refused: "
                         "config.json records a fingerprint of the training and test data); the change is recorded "
                         "in config.json's data_changes",
    "overwrite": "delete the outputs of the run already in --out before starting (without it, and without "
                 "--resume, a folder holding a run is refused)",
    "log_interval": "seconds between two progress lines in the log (a live one-line display instead on a terminal)",
    "log_level": f"log level of every rank: {', '.join(LOG_LEVELS)}",
    "log_dir": "also write each rank's log to DIR/rank-<r>.log (for post-mortems)",
    "record_params": "also write params.npy with the parameters after every step (small models only)",
    "loader_workers": "processes per worker that read the minibatches of its next jobs ahead, while it computes, "
                      "sends and waits (a torch Dataset's reads; arrays and HDF5 rows are held in memory and need "
                      "none); 0: each worker reads its own; auto: 2 for a Dataset whose reads take 2 ms or more "
                      "(its first 8 are read in place to tell), 0 otherwise",
    "prefetch": "with loader processes, how many jobs ahead a worker's minibatches are loaded (the memory "
                "held: this many jobs' minibatches and the current one's)",
    "compute_time": "emulate a cluster's compute: every partition gradient takes at least this many seconds (the "
                    "real gradient is computed and the rest slept), so ranks sharing cores behave like nodes",
    "device": "where the workers compute their gradients: cpu, cuda (a GPU per worker, chosen by its rank on its "
              "node: see docs/gpus.md) or auto (cuda where a GPU is visible)",
    "master_device": "where the master evaluates the model: cpu, cuda or auto (decoding and the optimizer step "
                     "stay on the CPU in this version)",
    "servers": "parameter servers K: ranks 0..K-1 each hold, decode and update one contiguous shard of the "
               "parameters (rank 0 also evaluates, logs and checkpoints; with pbs it also decides the order of the "
               "arrivals, which the others repeat); the workers are ranks K and up; not with ddp",
    "share_gpus": "let several ranks of a node use the same GPU when there are more ranks that want one than GPUs "
                  "(otherwise an error)",
    "memory_check": "before allocating, estimate what every rank will need (model, buffers, receive rows, "
                    "optimizer state, data) and stop with one line when a node's ranks need more than its "
                    "available memory or cgroup limit allows (--no-memory-check skips it)",
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
    "lr_milestones": "none",
    "clip_grad_norm": "none, no clipping",
    "scheduler": "none, --lr-schedule",
    "early_stop": "none",
    "keep_best": "none",
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


def _float_or_word(text: str) -> float | str:
    """A flag that takes a number or a word (--drop-compute 0.1, auto): checked when validated."""
    try:
        return float(text)
    except ValueError:
        return text


def _arg_type(annotation: str):
    if annotation == "int | str":
        return _int_or_word
    if annotation.startswith("float | str"):
        return _float_or_word
    if "int" in annotation:
        return int
    if "float" in annotation:
        return float
    return str


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
