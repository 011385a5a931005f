"""`pgc-bench EXPERIMENT.toml`: run every scheme x s x seed on the same straggler traces, then
write a results table (Markdown and CSV) and figures.

An experiment file:

    name = "fashion-mnist comparison"
    workers = 6
    schemes = ["dgd", "is-sgd", "gc-fr", "gc-cr", "pgc-fr", "pgc-cr", "pbs"]
    s = [1, 2]
    seeds = [0, 1, 2, 3, 4]     # each seed is a different straggler trace, the same for every scheme
    delays = ["exp:0.02", "none"]   # optional axis: delay models (default: [train]'s delay)
    is_gc_c = 2                 # c of the is-gc-* schemes (the paper's choice, also the default)
    target_loss = 0.6           # steps and wall time to reach it (full training loss)
    timeout = 1800              # seconds per run (MPIEXEC_TIMEOUT)
    launcher = "mpiexec -n {ranks}"   # e.g. "srun --mpi=pmi2 -n {ranks}" inside an allocation
    [train]                     # any pgc-train option, for every run
    dataset = "data/fashion-mnist.h5"
    model = "cnn"
    steps = 300
    delay = "exp:0.05"
    backend = "mpi"             # or "sim": simulate every run (torch model and data, simulated time;
                                # needs compute_time in [train]), same outputs
    [per_scheme.pbs]            # pgc-train options for one scheme's runs only
    replication = 2
    c = 4

dgd, pbs and ddp do not depend on s: they run once per seed and delay model (dgd is the reference of
the ratios, paired by seed and delay model). Runs already finished with the same options are
reused, so an interrupted sweep resumes where it stopped. results.md gives, per delay model,
scheme and s, means over the seeds with 95% confidence intervals (Student t), the ratios to dgd
computed seed by seed, and which scheme reaches the target first and whether its lead over the
runner-up is outside the noise.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, NamedTuple

from ..choices import BUILTIN_DATASETS, PEER_SCHEMES
from ..config import TrainConfig, tomllib
from ..core.schemes import SCHEME_NAMES
from ..errors import ConfigError, PgcError
from ..learning.plugins import is_spec
from ..runs.results import PAPER_RUN, RunSummary, run_completed, summarize_run
from ..runs.stats import Interval, interval

EXPERIMENT_KEYS = {"name": str, "workers": int, "schemes": list, "s": list, "seeds": list, "target_loss": float,
                   "timeout": int, "launcher": str, "is_gc_c": int, "train": dict, "per_scheme": dict,
                   "delays": list, "backend": str}
BACKENDS = ("mpi", "sim")
# schemes that ignore s: one run per seed, at the smallest s of the experiment
S_FREE = ("dgd", "pbs", "ddp")


def load_experiment(path: Path) -> dict[str, Any]:
    """The experiment file, checked for unknown keys, types and pgc-train options."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such experiment file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    for key, value in raw.items():
        if key not in EXPERIMENT_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r}; valid keys: {', '.join(EXPERIMENT_KEYS)}")
        want = EXPERIMENT_KEYS[key]
        if not isinstance(value, want) and not (want is float and isinstance(value, int)):
            raise ConfigError(f"{path}: {key!r} must be a {want.__name__}, got {value!r}")
    for key in ("workers", "schemes"):
        if key not in raw:
            raise ConfigError(f"{path}: missing required key {key!r}")
    train = _train_options(path, "[train]", raw.get("train", {}))
    per_scheme = {}
    for scheme, options in raw.get("per_scheme", {}).items():
        if scheme not in SCHEME_NAMES + PEER_SCHEMES:
            raise ConfigError(f"{path}: [per_scheme.{scheme}]: unknown scheme; choose from "
                              f"{', '.join(SCHEME_NAMES + PEER_SCHEMES)}")
        if not isinstance(options, dict):
            raise ConfigError(f"{path}: per_scheme.{scheme} must be a table of pgc-train options, got {options!r}")
        per_scheme[scheme] = _train_options(path, f"[per_scheme.{scheme}]", options)
    backend = raw.get("backend", "mpi")
    if backend not in BACKENDS:
        raise ConfigError(f"{path}: backend {backend!r} is not one of: {', '.join(BACKENDS)}")
    delays = raw.get("delays")
    if delays is not None and (not delays or not all(isinstance(d, str) for d in delays)):
        raise ConfigError(f"{path}: 'delays' must be a non-empty list of delay models (strings), got {delays!r}")
    return {"name": raw.get("name", Path(path).stem), "workers": raw["workers"], "schemes": raw["schemes"],
            "delays": delays or [train.get("delay", "none")], "delay_axis": delays is not None, "backend": backend,
            "s": raw.get("s", [1]), "seeds": raw.get("seeds", [0]), "target_loss": raw.get("target_loss"),
            "timeout": raw.get("timeout", 1800), "launcher": raw.get("launcher", "mpiexec -n {ranks}"),
            "is_gc_c": raw.get("is_gc_c"), "train": train, "per_scheme": per_scheme}


def _train_options(path: Path, table: str, raw: dict[str, Any]) -> dict[str, Any]:
    """A table of pgc-train options, checked against pgc-train's own (not the per-run ones)."""
    options = {k.replace("-", "_"): v for k, v in raw.items()}
    known = {f.name for f in fields(TrainConfig)} - {"scheme", "stragglers", "seed", "out"}
    bad = sorted(set(options) - known)
    if bad:
        raise ConfigError(f"{path}: {table} has unknown or per-run options {bad}; scheme, s and seeds are set "
                          f"at the top level")
    return options


class RunKey(NamedTuple):
    """One run of an experiment: scheme, s, delay model (an index into the experiment's delays), seed."""

    scheme: str
    s: int
    delay: int
    seed: int

    def describe(self, exp: dict[str, Any]) -> str:
        delay = f" delay={exp['delays'][self.delay]}" if exp["delay_axis"] else ""
        return f"{self.scheme} s={self.s}{delay} seed={self.seed}"


def run_options(exp: dict[str, Any], key: RunKey) -> dict[str, Any]:
    """The pgc-train options of one run."""
    options = {**exp["train"], **exp.get("per_scheme", {}).get(key.scheme, {}), "scheme": key.scheme,
               "stragglers": key.s, "seed": key.seed, "delay": exp["delays"][key.delay]}
    if key.scheme.startswith("is-gc-") and exp["is_gc_c"] is not None:
        options["c"] = exp["is_gc_c"]
    return options


def plan(exp: dict[str, Any]) -> list[tuple[RunKey, str | None]]:
    """(run, reason it cannot run or None) for every run of the experiment."""
    runs = []
    for delay in range(len(exp["delays"])):
        for seed in exp["seeds"]:
            for scheme in exp["schemes"]:
                for s in ([min(exp["s"])] if scheme in S_FREE else exp["s"]):
                    key = RunKey(scheme, s, delay, seed)
                    try:
                        _validate(exp, key)
                        reason = None
                    except ConfigError as exc:
                        reason = str(exc)
                    runs.append((key, reason))
    return runs


def _validate(exp: dict[str, Any], key: RunKey) -> None:
    """ConfigError unless the run can be launched (MPI) or simulated (sim) as the file says."""
    options = run_options(exp, key)
    TrainConfig(**options).validate(exp["workers"])
    if exp["backend"] == "sim":
        from ..sim.backend import sim_config

        sim_config(options, exp["workers"])


def check_data(exp: dict[str, Any]) -> None:
    """ConfigError unless every data file the runs name exists (before hours of runs start)."""
    named = {exp["train"].get("dataset")} | {o.get("dataset") for o in exp.get("per_scheme", {}).values()}
    for dataset in sorted(d for d in named if d is not None and d not in BUILTIN_DATASETS and not is_spec(d)):
        if not Path(dataset).is_file():
            raise ConfigError(f"data file {dataset} does not exist: make it first (python -m data_prep --help) "
                              f"or fix 'dataset' in the experiment file")


def check_launcher(exp: dict[str, Any]) -> None:
    """ConfigError unless the MPI runs' launcher is there: in the venv (the [mpich] extra's
    mpiexec, which run_one prefers) or on PATH."""
    if exp["backend"] != "mpi":
        return
    program = shlex.split(exp["launcher"].format(ranks=exp["workers"] + 1))[0]
    if (Path(sys.executable).parent / program).exists() or shutil.which(program):
        return
    hint = "pip install 'pgc-mpi[mpich]' for MPICH's, or put your MPI's on PATH" if program == "mpiexec" else \
        "put it on PATH"
    raise ConfigError(f"the experiment's launcher {program} is not installed: {hint} (or set 'launcher' in the "
                      f"experiment file)")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def run_toml(exp: dict[str, Any], key: RunKey) -> str:
    """The TOML file a run's pgc-train reads (also how a finished run is recognized for reuse)."""
    return "".join(f"{k} = {_toml_value(v)}\n" for k, v in run_options(exp, key).items() if v is not None)


def run_one(exp: dict[str, Any], key: RunKey, out: Path) -> tuple[int, float]:
    """Launch one pgc-train job; returns (exit code, seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.toml").write_text(run_toml(exp, key))
    if exp["backend"] == "sim":
        return _simulate_one(exp, key, out)
    ranks = exp["workers"] + 1
    launcher = shlex.split(exp["launcher"].format(ranks=ranks))
    local = Path(sys.executable).parent / launcher[0]
    if local.exists():  # the venv's own mpiexec, matching its mpi4py
        launcher[0] = str(local)
    cmd = [*launcher, sys.executable, "-m", "pgc_mpi", "train", "--config", str(out / "run.toml"), "--out", str(out)]
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(exp["timeout"]), "OMP_NUM_THREADS": "1"}
    began = time.monotonic()
    with (out / "log.txt").open("w") as log:
        rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=exp["timeout"] + 60).returncode
    return rc, time.monotonic() - began


SUMMARY_KEYS = ("time_to_target", "steps_to_target", "median_step_time", "step_time_vs_dgd", "time_vs_dgd",
                "steps_vs_dgd", "final_test_accuracy", "utilization", "wasted_gradients", "bytes_per_step",
                "max_staleness", "steps_to_target_decoded", "time_to_target_decoded", "steps_vs_dgd_decoded",
                "time_vs_dgd_decoded")
# paired ratios to dgd: each of these is the run's figure over dgd's with the same seed and delay model
RATIOS = {"time_vs_dgd": "time_to_target", "steps_vs_dgd": "steps_to_target",
          "time_vs_dgd_decoded": "time_to_target_decoded", "steps_vs_dgd_decoded": "steps_to_target_decoded"}


def _simulate_one(exp: dict[str, Any], key: RunKey, out: Path) -> tuple[int, float]:
    """Simulate one run into `out` (pgc_mpi.sim.backend); returns (exit code, seconds)."""
    from ..sim.backend import run_simulated

    began = time.monotonic()
    try:
        run_simulated(run_options(exp, key), exp["workers"], out)
        rc = 0
    except PgcError as exc:
        (out / "log.txt").write_text(f"pgc-bench: error: {exc}\n")
        rc = 2
    return rc, time.monotonic() - began


def aggregate(rows: list[RunSummary]) -> list[dict[str, Any]]:
    """Per (delay model, scheme, s): the mean and 95% interval over seeds of every figure; the
    ratios to dgd are taken seed by seed against dgd's run with the same seed and delay model."""
    dgd = {(r.delay, r.seed): r for r in rows if r.scheme == "dgd"}
    groups: dict[tuple[str, str, int], list[RunSummary]] = {}
    for r in rows:
        groups.setdefault((r.delay, r.scheme, r.s), []).append(r)
    out = []
    for (delay, scheme, s), runs in groups.items():
        row: dict[str, Any] = {"delay": delay, "scheme": scheme, "s": "-" if scheme in S_FREE else s,
                               "runs": len(runs), "reached": sum(r.time_to_target is not None for r in runs),
                               "reached_decoded": sum(r.time_to_target_decoded is not None for r in runs),
                               "seeds": [r.seed for r in runs]}
        for key in SUMMARY_KEYS:
            row[key] = interval([_figure(r, key, dgd.get((r.delay, r.seed))) for r in runs])
        out.append(row)
    return out


def _figure(r: RunSummary, key: str, dgd: RunSummary | None) -> float:
    """One run's value of a summary figure (nan when it has none, e.g. the target never reached)."""
    if key in RATIOS:
        mine, base = getattr(r, RATIOS[key]), getattr(dgd, RATIOS[key]) if dgd is not None else None
        return mine / base if mine is not None and base else math.nan
    value = getattr(r, key)
    return math.nan if value is None else float(value)


def winners(rows: list[dict[str, Any]], summaries: list[RunSummary]) -> list[str]:
    """Per delay model and s: the scheme with the shortest mean time to target (among those that
    reached it on every seed), and whether its lead over the runner-up is outside the noise
    (the 95% interval of their per-seed differences excludes 0)."""
    by_run = {(r.delay, r.scheme, r.seed, "-" if r.scheme in S_FREE else r.s): r for r in summaries}
    lines = []
    for delay in dict.fromkeys(r["delay"] for r in rows):
        for s in sorted({r["s"] for r in rows if r["delay"] == delay and r["s"] != "-"}) or ["-"]:
            field = [r for r in rows if r["delay"] == delay and r["s"] in (s, "-") and r["reached"] == r["runs"]
                     and not math.isnan(r["time_to_target"].mean)]
            field.sort(key=lambda r: r["time_to_target"].mean)
            if not field:
                lines.append(f"| {delay} | {s} | no scheme reached the target on every seed | | |")
                continue
            first = field[0]
            if len(field) == 1:
                lines.append(f"| {delay} | {s} | {first['scheme']} | (alone) | |")
                continue
            second = field[1]
            diffs = [_time(by_run, delay, second, seed) - _time(by_run, delay, first, seed) for seed in first["seeds"]]
            lead = interval(diffs)
            verdict = "yes" if lead.excludes(0.0) else "no (within noise)"
            lines.append(f"| {delay} | {s} | {first['scheme']} | {second['scheme']} (+{lead}) | {verdict} |")
    return ["| delay | s | fastest to target | runner-up (time behind, 95% CI) | lead outside noise |",
            "|---|---|---|---|---|", *lines]


def _time(by_run: dict, delay: str, row: dict[str, Any], seed: int) -> float:
    """The time to target of one seed's run of an aggregated row (nan if missing or never reached)."""
    r = by_run.get((delay, row["scheme"], seed, row["s"]))
    return r.time_to_target if r is not None and r.time_to_target is not None else math.nan


def markdown_table(rows: list[dict[str, Any]], has_target: bool = True) -> str:
    """The aggregated results as Markdown: one table per delay model, mean [95% CI] over seeds."""
    head = ["scheme", "s", "seeds", "reached", "time to target (s)", "steps to target", "median step (s)",
            "step vs dgd", "time vs dgd", "final test acc", "utilization", "wasted grads", "MB recv/step",
            "max stale"]
    keys = ["time_to_target", "steps_to_target", "median_step_time", "step_time_vs_dgd", "time_vs_dgd",
            "final_test_accuracy", "utilization", "wasted_gradients", "bytes_per_step", "max_staleness"]
    out = []
    for delay in dict.fromkeys(r["delay"] for r in rows):
        out += [f"### delay {delay}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (r for r in rows if r["delay"] == delay):
            cells = [r["scheme"], str(r["s"]), str(r["runs"]), f"{r['reached']}/{r['runs']}" if has_target else "-"]
            for key in keys:
                value = r[key]
                if key == "bytes_per_step":
                    value = Interval(*(v / 1e6 for v in (value.mean, value.low, value.high)), value.k)
                cells.append(str(value))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def stopping_rules_table(rows: list[dict[str, Any]]) -> str:
    """Steps to target under both stopping rules, with their paired ratios to dgd: the full
    training loss at an evaluation, and the paper's rule (the decoded training loss at or below
    the target for 3 consecutive steps), as Markdown, one table per delay model."""
    head = ["scheme", "s", "reached (full)", "steps (full)", "steps vs dgd (full)", "reached (decoded)",
            "steps (decoded)", "steps vs dgd (decoded)", "time vs dgd (decoded)"]
    out = []
    for delay in dict.fromkeys(r["delay"] for r in rows):
        out += [f"### delay {delay}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (r for r in rows if r["delay"] == delay):
            out.append("| " + " | ".join([
                r["scheme"], str(r["s"]), f"{r['reached']}/{r['runs']}", str(r["steps_to_target"]),
                str(r["steps_vs_dgd"]), f"{r['reached_decoded']}/{r['runs']}", str(r["steps_to_target_decoded"]),
                str(r["steps_vs_dgd_decoded"]), str(r["time_vs_dgd_decoded"])]) + " |")
        out.append("")
    return "\n".join(out)


def run_dir_of(out: Path, exp: dict[str, Any], key: RunKey) -> Path:
    """Where one run's outputs go."""
    delay = f"-d{key.delay}" if exp["delay_axis"] else ""
    return out / f"{key.scheme}-s{key.s}{delay}-seed{key.seed}"


def gather(exp: dict[str, Any], out: Path, todo: list[RunKey]) -> int:
    """Summarize the finished runs under `out` into results.csv, results.md and figures."""
    finished = {key: run_dir_of(out, exp, key) for key in todo if run_completed(run_dir_of(out, exp, key))}
    missing = [key for key in todo if key not in finished]
    for key in missing:
        print(f"no completed run for {key.describe(exp)} in {out}", file=sys.stderr)
    if not finished:
        return 1
    dgd = {(key.delay, key.seed): summarize_run(d, None).median_step_time for key, d in finished.items()
           if key.scheme == "dgd"}
    rows = [summarize_run(d, exp["target_loss"], dgd.get((key.delay, key.seed))) for key, d in finished.items()]
    with (out / "results.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0].as_row()))
        writer.writeheader()
        writer.writerows(r.as_row() for r in rows)
    target = exp["target_loss"]
    aggregated = aggregate(rows)
    table = markdown_table(aggregated, has_target=target is not None)
    train = exp["train"]
    decisions = (f"FR schemes decode: {train.get('fr_decode', 'covered')}; staleness bound: "
                 f"{train.get('max_staleness', 'window')} (--on-stale {train.get('on_stale', 'refresh')})")
    text = (f"# {exp['name']}\n\n{exp['workers']} workers; target loss {target if target is not None else '-'}; "
            f"mean [95% confidence interval] over seeds {exp['seeds']}; ratios to dgd paired by seed and delay "
            f"model; {decisions}; options {exp['train']}\n\n{table}\n")
    if target is not None:
        text += "\n## Who reaches the target first\n\n" + "\n".join(winners(aggregated, rows)) + "\n"
        text += ("\n## Steps to target under both stopping rules\n\nfull: the full training loss at an evaluation "
                 f"(every {train.get('eval_every', TrainConfig.eval_every)} steps) at or below the target; decoded "
                 "(the paper's rule): each step's mean minibatch loss over the messages the master used at or below "
                 f"the target for {PAPER_RUN} consecutive steps\n\n" + stopping_rules_table(aggregated) + "\n")
    (out / "results.md").write_text(text)
    print(text)
    from .plot import PLOT_EXTRA, draw, draw_ratios, have_matplotlib

    if not have_matplotlib():
        print(f"pgc-bench: no figures: they need matplotlib: {PLOT_EXTRA}", file=sys.stderr)
        return 1 if missing else 0

    # runs that started but did not complete are drawn too, marked (not silently dropped)
    started = [run_dir_of(out, exp, key) for key in todo if (run_dir_of(out, exp, key) / "metrics.jsonl").is_file()]
    for f in draw(started, out, target):
        print(f)
    if target is not None and any(r["scheme"] == "dgd" for r in aggregated):
        print(draw_ratios(aggregated, out, f"{exp['name']}: {exp['workers']} workers, seeds {exp['seeds']}"))
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-bench`."""
    p = argparse.ArgumentParser(prog="pgc-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", type=Path, help="experiment TOML file")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: bench/<experiment name>)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    mode.add_argument("--count", action="store_true", help="print the number of runs (for a job array) and exit")
    mode.add_argument("--run-index", type=int, default=None, metavar="K",
                      help="run only the K-th run (0-based; a job array task) and write no table")
    mode.add_argument("--gather", action="store_true", help="only summarize the runs already in --out")
    args = p.parse_args(argv)
    try:
        exp = load_experiment(args.experiment)
        runs = plan(exp)
    except PgcError as exc:
        print(f"pgc-bench: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path("bench") / exp["name"].replace(" ", "-")
    for key, reason in runs:
        if reason and not args.count:
            print(f"skipping {key.describe(exp)}: {reason}", file=sys.stderr)
    todo = [key for key, reason in runs if reason is None]
    if args.count:
        print(len(todo))
        return 0
    if args.dry_run:
        for k, key in enumerate(todo):
            print(f"{k}: {key.describe(exp)}")
        return 0
    if args.gather:
        return gather(exp, out, todo)
    if args.run_index is not None and not 0 <= args.run_index < len(todo):
        print(f"pgc-bench: error: --run-index {args.run_index} is outside 0..{len(todo) - 1}", file=sys.stderr)
        return 2
    chosen = [todo[args.run_index]] if args.run_index is not None else todo
    try:
        check_data(exp)
        reusable = _reusable(exp, out, chosen)
        if set(chosen) - reusable:
            check_launcher(exp)
    except PgcError as exc:
        print(f"pgc-bench: error: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for k, key in enumerate(chosen, start=1):
        run_dir = run_dir_of(out, exp, key)
        print(f"[{k}/{len(chosen)}] {key.describe(exp)} ...", end=" ", flush=True)
        if key in reusable:
            print("finished before, reused", flush=True)
            continue
        rc, took = run_one(exp, key, run_dir)
        failed += rc != 0
        print(f"done in {took:.0f} s" if rc == 0 else f"FAILED (exit {rc}; see {run_dir / 'log.txt'})", flush=True)
    if args.run_index is not None:
        return 1 if failed else 0
    return 1 if gather(exp, out, todo) or failed else 0


def _reusable(exp: dict[str, Any], out: Path, keys: list[RunKey]) -> set[RunKey]:
    """The runs already finished in `out` with the same options; a finished run with other options
    is an error (the experiment file changed: use another --out, or remove that run)."""
    done = set()
    for key in keys:
        run_dir = run_dir_of(out, exp, key)
        if not run_completed(run_dir):
            continue
        toml = run_dir / "run.toml"
        if not toml.is_file() or toml.read_text() != run_toml(exp, key):
            raise ConfigError(f"{run_dir} holds a finished run with other options than the experiment file gives "
                              f"{key.describe(exp)}: use another --out, or remove {run_dir} to rerun it")
        done.add(key)
    return done


if __name__ == "__main__":
    sys.exit(main())
