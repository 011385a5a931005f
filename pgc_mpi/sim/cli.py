"""`pgc-sim`: compare schemes side by side in the simulator, on the same straggler delays.

The problem is a synthetic convex one by default (--problem least-squares|logistic: a known
optimum, so the target is an optimality gap), or pgc-train's: a torch model on a data set, once
--model or --dataset is given (built by the same function, torch_problem.load_problem; the target is
then a loss, --target-loss). Giving both kinds of options is an error, as is an option that
does not apply to the chosen kind.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from ..choices import DTYPE_NAMES
from ..config import (
    CORE_FIELDS,
    DEFAULT_BATCH_SIZE,
    DEFAULT_DATASET,
    DEFAULT_MODEL,
    MAX_SEED,
    SYNTHETIC_DEFAULTS,
    SimConfig,
    TrainConfig,
    _add_field_options,
    add_core_options,
    available_cores,
    check_plugin_names,
    refuse_mixed_problem,
    show_default,
)
from ..core.sampling import needs_labels, refuse_unlabelled
from ..core.traits import PEER_SCHEMES, SCHEME_NAMES, traits
from ..errors import ConfigError, PgcError
from ..learning.problems import PROBLEMS, Problem
from .report import Target, format_table, summarize

if TYPE_CHECKING:  # pgc_mpi.sim.simulator imports torch (its optimizer): main() imports it once the flags are valid
    from .simulator import SimResult

# pgc-sim's own defaults for shared options: a cluster with exponential stragglers to compare schemes on
SIM_DEFAULTS = {"delay": "exp:1.0", "steps": 200}
# Defaults that depend on the kind of problem: (synthetic, torch). A torch problem takes pgc-train's
# minibatch and evaluation cadence (evaluating a whole data set every step would dominate the run).
BATCH_SIZE = (None, DEFAULT_BATCH_SIZE)
EVAL_EVERY = (1, TrainConfig.eval_every)
SYNTHETIC = {"problem": "least-squares", **SYNTHETIC_DEFAULTS, "target_gap": 1e-3}
TORCH = {"model": DEFAULT_MODEL, "dataset": DEFAULT_DATASET, "loss": None, "dtype": TrainConfig.dtype,
         "eval_train": TrainConfig.eval_train, "verify_data": TrainConfig.verify_data, "threads": TrainConfig.threads}


@dataclass(frozen=True)
class ProblemChoice:
    """The problem every run simulates: a synthetic one (`synthetic`: its name) or pgc-train's
    torch `model` on `dataset`; the fields of the other kind are None. A synthetic problem's data
    follow each run's seed, or `data_seed` when given (pgc-advise: the probe's problem on every seed)."""

    synthetic: str | None
    samples: int | None
    dim: int | None
    model: str | None
    dataset: str | None
    loss: str | None
    batch_size: int | None
    dtype: str | None
    eval_train: bool | None
    verify_data: bool | None
    threads: int | None
    data_seed: int | None = None  # a synthetic problem's data from this seed whatever the run's (pgc-advise)

    @property
    def is_torch(self) -> bool:
        return self.synthetic is None

    def build(self, workers: int, seed: int, verify: bool = True, partitioning: str = "iid") -> Problem:
        """The problem of one seed (`verify`: check the data file's checksum; once per run is enough), its
        training data cut as `partitioning` says (--partitioning; a synthetic problem's are iid)."""
        if not self.is_torch:
            return PROBLEMS[self.synthetic](workers, samples=self.samples, dim=self.dim, batch_size=self.batch_size,
                                            seed=seed if self.data_seed is None else self.data_seed)
        import torch  # only once the flags are known to be valid

        from ..learning.torch_problem import load_problem

        # pgc-train's default of one thread per rank: small minibatches gain nothing from more, and
        # threads that spin on busy cores cost several times the compute (measured: 6x CPU at 2 threads)
        torch.set_num_threads(self.threads)
        return load_problem(self.dataset, self.model, workers, self.batch_size, seed=seed, dtype=self.dtype,
                            eval_train=self.eval_train, verify=verify and self.verify_data, loss=self.loss,
                            partitioning=partitioning)

    def describe(self) -> str:
        return f"{self.model} on {self.dataset}" if self.is_torch else f"{self.synthetic} problem"


def build_parser() -> argparse.ArgumentParser:
    """The pgc-sim argument parser: the options shared with pgc-train, then the simulator's own."""
    p = argparse.ArgumentParser(
        prog="pgc-sim",
        description="Simulate straggler schemes on one problem and the same seeded delays, and "
                    "print steps and simulated time to a target: an optimality gap for the synthetic "
                    "problems (--problem), a loss for a torch model on a data set (--model, --dataset, "
                    "as pgc-train). Times (--delay, --deadline, --compute-time) are simulated seconds; "
                    "every gradient is really computed.",
    )
    add_core_options(p, SIM_DEFAULTS, skip=("scheme",))
    _add_simulator_options(p.add_argument_group("simulator options"))
    _add_synthetic_options(p.add_argument_group("synthetic problem (the default)"))
    _add_torch_options(p.add_argument_group("torch model and data set (as pgc-train; given: replaces --problem)"))
    return p


def _add_simulator_options(own: argparse._ArgumentGroup) -> None:
    own.add_argument("--schemes", default=",".join(SCHEME_NAMES),
                     help=f"comma-separated schemes, all: {','.join(SCHEME_NAMES)} (default: %(default)s)")
    own.add_argument("-n", "--workers", type=int, default=SimConfig.workers,
                     help=f"number of workers {show_default('workers', SimConfig.workers)}")
    own.add_argument("--batch-size", type=int, default=None,
                     help=f"minibatch per partition gradient (default: the whole partition for --problem, "
                          f"{BATCH_SIZE[1]} for --model/--dataset)")
    own.add_argument("--compute-time", type=float, default=SimConfig.compute_time,
                     help="simulated seconds per partition gradient "
                          f"{show_default('compute_time', SimConfig.compute_time)}")
    own.add_argument("--target-gap", type=float, default=None,
                     help="synthetic problems: optimality gap F(w)-F* that counts as reached "
                          f"(default: {SYNTHETIC['target_gap']:g} unless --target-loss)")
    own.add_argument("--target-loss", type=float, default=None,
                     help="loss that counts as reached: the evaluated training loss (the test loss with "
                          "--no-eval-train) (default: none for --model/--dataset, only final losses)")
    own.add_argument("--stop-at-target", action="store_true",
                     help="stop each run once the target is reached (default: off, run all --steps)")
    own.add_argument("--eval-every", type=int, default=None,
                     help="evaluate the problem (loss, gap, accuracy) every this many steps and after the last; "
                          "targets are checked at evaluations only (default: 1 for --problem, "
                          f"{EVAL_EVERY[1]} for --model/--dataset, as pgc-train)")
    own.add_argument("--probe-every", type=int, default=SimConfig.probe_every,
                     help="steps between two probes of pbs's diagnostics (pgc-train: --eval-every) "
                          f"{show_default('probe_every', SimConfig.probe_every)}")
    own.add_argument("--master-cost", default=None, metavar="FILE",
                     help="charge the master's own work (receive, decode, update, send) on the simulated clock "
                          "with this cost model (JSON, written by benchmarks/master_cost.py --fit) "
                          "(default: the master takes no time)")
    own.add_argument("--seeds", type=int, default=1,
                     help="run every scheme with seeds SEED, SEED+1, ... (data, partitions and delays follow "
                          "the seed; the schemes of one seed see the same delays) and report mean±sd "
                          "(default: %(default)s)")
    own.add_argument("--out", type=Path, default=None,
                     help="write every run's per-step records as JSON lines to this file (default: none)")


def _add_synthetic_options(group: argparse._ArgumentGroup) -> None:
    # parsed as None when not given, so that giving one with --model/--dataset is an error
    group.add_argument("--problem", default=None, choices=sorted(PROBLEMS),
                       help=f"synthetic problem with a known optimum (default: {SYNTHETIC['problem']}, "
                            "unless --model/--dataset)")
    group.add_argument("--samples", type=int, default=None,
                       help=f"training samples (default: {SYNTHETIC['samples']})")
    group.add_argument("--dim", type=int, default=None, help=f"parameters (default: {SYNTHETIC['dim']})")


def _add_torch_options(group: argparse._ArgumentGroup) -> None:
    # pgc-train's own options and help texts; parsed as None when not given (see _add_synthetic_options)
    train = {f.name: f for f in fields(TrainConfig)}
    _add_field_options(group, [train["model"], train["dataset"], train["loss"]],
                       {"model": f"{TORCH['model']} with --dataset", "dataset": f"{TORCH['dataset']} with --model"},
                       fill_defaults=False)
    group.add_argument("--dtype", default=None,
                       help=f"{' or '.join(DTYPE_NAMES)} for the model's gradients (the simulated master keeps "
                            f"float64 parameters) (default: {TORCH['dtype']})")
    group.add_argument("--eval-train", action=argparse.BooleanOptionalAction, default=None,
                       help="evaluate on the whole training split too (--no-eval-train: the test split only; "
                            "--target-loss is then the test loss) (default: on)")
    _add_field_options(group, [train["verify_data"]], {}, fill_defaults=False)
    group.add_argument("--threads", type=int, default=None,
                       help=f"torch threads for the model's gradients and evaluations (default: {TORCH['threads']})")


def problem_from_args(args: argparse.Namespace) -> ProblemChoice:
    """The problem the flags choose (ConfigError for options of the other kind or bad values)."""
    torch_given = _given(args, ("model", "dataset", "loss"))
    synthetic_given = _given(args, ("problem", "samples", "dim"))
    refuse_mixed_problem(synthetic_given, torch_given)
    if args.batch_size is not None and args.batch_size < 1:
        raise ConfigError(f"--batch-size must be a positive integer, got {args.batch_size}")
    return _torch_choice(args) if torch_given else _synthetic_choice(args)


def _synthetic_choice(args: argparse.Namespace) -> ProblemChoice:
    _refuse(args, tuple(name for name in TORCH if name not in ("model", "dataset", "loss")),
            "only to a torch problem (--model/--dataset)")
    values = {name: _or(getattr(args, name), SYNTHETIC[name]) for name in ("problem", "samples", "dim")}
    if needs_labels(args.partitioning):
        refuse_unlabelled(args.partitioning, f"the synthetic --problem {values['problem']}")
    _positive_ints(values, ("samples", "dim"))
    return ProblemChoice(values["problem"], values["samples"], values["dim"], None, None, None, args.batch_size,
                         None, None, None, None)


def _torch_choice(args: argparse.Namespace) -> ProblemChoice:
    values = {name: _or(getattr(args, name), default) for name, default in TORCH.items()}
    check_plugin_names(values["model"], values["loss"])
    if values["dtype"] not in DTYPE_NAMES:
        raise ConfigError(f"--dtype {values['dtype']!r} is not one of: {', '.join(DTYPE_NAMES)}")
    _positive_ints(values, ("threads",))
    if values["threads"] > available_cores():  # torch aborts in native code when asked for too many
        raise ConfigError(f"--threads {values['threads']} is more than the {available_cores()} cores this process "
                          f"may use")
    return ProblemChoice(None, None, None, values["model"], values["dataset"], values["loss"],
                         _or(args.batch_size, BATCH_SIZE[1]),
                         values["dtype"], values["eval_train"], values["verify_data"], values["threads"])


def target_from_args(args: argparse.Namespace, problem: ProblemChoice) -> Target:
    """The target the table measures against (ConfigError for a gap without a known optimum)."""
    if args.target_gap is not None and args.target_loss is not None:
        raise ConfigError("--target-gap and --target-loss exclude each other: give one target")
    if args.target_gap is not None and problem.is_torch:
        raise ConfigError("--target-gap needs a known optimum (the synthetic --problem); for --model/--dataset "
                          "use --target-loss")
    if args.target_gap is not None and not (math.isfinite(args.target_gap) and args.target_gap >= 0):
        raise ConfigError(f"--target-gap must be a finite number >= 0, got {args.target_gap}")
    if args.target_loss is not None and not math.isfinite(args.target_loss):
        raise ConfigError(f"--target-loss must be a finite number, got {args.target_loss}")
    eval_every = _or(args.eval_every, EVAL_EVERY[problem.is_torch])
    if args.target_loss is not None or problem.is_torch:
        return Target("loss", args.target_loss, eval_every)
    return Target("gap", _or(args.target_gap, SYNTHETIC["target_gap"]), eval_every)


def configs_from_args(args: argparse.Namespace) -> dict[str, SimConfig]:
    """One validated SimConfig per scheme of --schemes for the first seed (ConfigError on the
    first bad one); the other seeds' configurations differ only in the seed."""
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    bad = [s for s in schemes if s not in SCHEME_NAMES]
    if not schemes:
        raise ConfigError("--schemes names no scheme")
    peers = [s for s in bad if s in PEER_SCHEMES]
    if peers:  # ddp has the same trajectory and waiting rule as dgd: simulate dgd instead
        raise PgcError(f"{', '.join(peers)} runs only under pgc-train (torch.distributed workers), not in the "
                       f"simulator; its simulated equivalent is dgd (same gradients, waits for every worker)")
    if bad:
        raise PgcError(f"unknown scheme(s) {bad}; choose from: {', '.join(SCHEME_NAMES)}")
    if args.seeds < 1 or args.seed + args.seeds - 1 > MAX_SEED:
        raise ConfigError(f"--seeds must be a positive integer with --seed + --seeds - 1 <= {MAX_SEED}, "
                          f"got {args.seeds}")
    target = target_from_args(args, problem_from_args(args))
    if args.master_cost is not None:
        from .master_cost import load

        load(args.master_cost)  # ConfigError now, not after the problem is built
    stop = {"target_gap" if target.kind == "gap" else "target_loss": target.value} if args.stop_at_target else {}
    shared = {name: getattr(args, name) for name in CORE_FIELDS if name != "scheme"}
    return {
        name: SimConfig(**{**shared, "scheme": name, "c": args.c if traits(name).sets_c else None,
                           "replication": args.replication if traits(name).table else None,
                           "adapt": args.adapt and traits(name).table},
                        workers=args.workers, compute_time=args.compute_time, probe_every=args.probe_every,
                        eval_every=target.eval_every, master_cost=args.master_cost,
                        **stop)
        for name in schemes
    }


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """The flags among `names` given on the command line (parsed to something other than None), as
    typed (--no-X for a switch turned off)."""
    flags = []
    for name in names:
        value = getattr(args, name)
        if value is not None:
            flags.append(("--no-" if value is False else "--") + name.replace("_", "-"))
    return flags


def _refuse(args: argparse.Namespace, names: tuple[str, ...], why: str) -> None:
    given = _given(args, names)
    if given:
        raise ConfigError(f"{' and '.join(given)} {'applies' if len(given) == 1 else 'apply'} {why}")


def _positive_ints(values: dict, names: tuple[str, ...]) -> None:
    for name in names:
        if values[name] < 1:
            raise ConfigError(f"--{name} must be a positive integer, got {values[name]}")


def _or(value, default):
    return default if value is None else value


def run_all(configs: dict[str, SimConfig], problem: ProblemChoice, first_seed: int, seeds: int,
            per_seed: Callable[[str, SimConfig], SimConfig] | None = None) -> dict[str, list[SimResult]]:
    """Every scheme on every seed's problem: {scheme: [result per seed]}, with progress on stderr.
    `per_seed(name, cfg)`: the configuration to run for one name and seed (`cfg` has the seed
    already; pgc-advise gives each seed its own replay of a measured trace)."""
    from .simulator import simulate  # torch: only once every configuration is known to be valid

    results: dict[str, list[SimResult]] = {name: [] for name in configs}
    workers, partitioning = next(iter(configs.values())).workers, next(iter(configs.values())).partitioning
    for seed in range(first_seed, first_seed + seeds):
        began = time.perf_counter()
        built = problem.build(workers, seed, verify=seed == first_seed, partitioning=partitioning)  # check once
        print(f"built the {problem.describe()} (seed {seed}, {built.dim} parameters) in "
              f"{time.perf_counter() - began:.2f} s", file=sys.stderr)
        for name, cfg in configs.items():
            began = time.perf_counter()
            seeded = dataclasses.replace(cfg, seed=seed)
            results[name].append(simulate(per_seed(name, seeded) if per_seed else seeded, built))
            print(f"simulated {name} (seed {seed}): {len(results[name][-1].records)} steps in "
                  f"{time.perf_counter() - began:.2f} s", file=sys.stderr)
    return results


def write_records(path: Path, results: dict[str, list[SimResult]]) -> None:
    """Every run's step records and evaluations (marked "event": "eval", as in pgc-train's metrics)
    as JSON lines, each with its scheme and seed (and its --partitioning where it is not iid)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for name, runs in results.items():
            for res in runs:
                evals = {e["step"]: e for e in res.evals}
                run = {"scheme": name, "seed": res.config.seed}
                if res.config.partitioning != "iid":
                    run["partitioning"] = res.config.partitioning
                for rec in res.records:
                    fh.write(json.dumps({**run, **rec}) + "\n")
                    if rec["step"] in evals:
                        fh.write(json.dumps({**run, "event": "eval", **evals[rec["step"]]}) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-sim`."""
    args = build_parser().parse_args(argv)
    try:
        configs = configs_from_args(args)
        problem = problem_from_args(args)
        target = target_from_args(args, problem)
        results = run_all(configs, problem, args.seed, args.seeds)
    except PgcError as exc:
        print(f"pgc-sim: error: {exc}", file=sys.stderr)
        return 2
    key = target.key(next(iter(results.values()))[0])
    staleness = f"; --max-staleness {args.max_staleness}, --on-stale {args.on_stale}"
    staleness += f"; --partitioning {args.partitioning}" if args.partitioning != "iid" else ""
    print(format_table(summarize(results, target), target, key, args.fr_decode, staleness))
    if args.out is not None:
        write_records(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
