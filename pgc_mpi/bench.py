"""`pgc-bench EXPERIMENT.toml`: run every scheme x s x seed on the same straggler traces, then
write a results table (Markdown and CSV) and figures.

An experiment file:

    name = "fashion-mnist comparison"
    workers = 6
    schemes = ["dgd", "is-sgd", "gc-fr", "gc-cr", "pgc-fr", "pgc-cr", "pbs"]
    s = [1, 2]
    seeds = [0]                 # each seed is a different straggler trace, the same for every scheme
    is_gc_c = 2                 # c of the is-gc-* schemes (the paper's choice, also the default)
    target_loss = 0.6           # steps and wall time to reach it (full training loss)
    timeout = 1800              # seconds per run (MPIEXEC_TIMEOUT)
    launcher = "mpiexec -n {ranks}"   # e.g. "srun --mpi=pmi2 -n {ranks}" inside an allocation
    [train]                     # any pgc-train option, for every run
    dataset = "data/fashion-mnist.h5"
    model = "cnn"
    steps = 300
    delay = "exp:0.05"
    [per_scheme.pbs]            # pgc-train options for one scheme's runs only
    replication = 2
    c = 4

dgd and pbs do not depend on s: they run once per seed (dgd is the reference of the step-time
ratio).
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from .config import TrainConfig, tomllib
from .errors import ConfigError, PgcError
from .results import RunSummary, summarize_run
from .schemes import SCHEME_NAMES

EXPERIMENT_KEYS = {"name": str, "workers": int, "schemes": list, "s": list, "seeds": list, "target_loss": float,
                   "timeout": int, "launcher": str, "is_gc_c": int, "train": dict, "per_scheme": dict}
# schemes that ignore s: one run per seed, at the smallest s of the experiment
S_FREE = ("dgd", "pbs")


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
        if scheme not in SCHEME_NAMES:
            raise ConfigError(f"{path}: [per_scheme.{scheme}]: unknown scheme; choose from {', '.join(SCHEME_NAMES)}")
        if not isinstance(options, dict):
            raise ConfigError(f"{path}: per_scheme.{scheme} must be a table of pgc-train options, got {options!r}")
        per_scheme[scheme] = _train_options(path, f"[per_scheme.{scheme}]", options)
    return {"name": raw.get("name", Path(path).stem), "workers": raw["workers"], "schemes": raw["schemes"],
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


def run_options(exp: dict[str, Any], scheme: str, s: int, seed: int) -> dict[str, Any]:
    """The pgc-train options of one run."""
    options = {**exp["train"], **exp.get("per_scheme", {}).get(scheme, {}), "scheme": scheme, "stragglers": s,
               "seed": seed}
    if scheme.startswith("is-gc-") and exp["is_gc_c"] is not None:
        options["c"] = exp["is_gc_c"]
    return options


def plan(exp: dict[str, Any]) -> list[tuple[str, int, int, str | None]]:
    """(scheme, s, seed, reason it cannot run or None) for every run of the experiment."""
    runs = []
    for seed in exp["seeds"]:
        for scheme in exp["schemes"]:
            for s in ([min(exp["s"])] if scheme in S_FREE else exp["s"]):
                cfg = TrainConfig(**run_options(exp, scheme, s, seed))
                try:
                    cfg.validate(exp["workers"])
                    reason = None
                except ConfigError as exc:
                    reason = str(exc)
                runs.append((scheme, s, seed, reason))
    return runs


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def run_one(exp: dict[str, Any], scheme: str, s: int, seed: int, out: Path) -> tuple[int, float]:
    """Launch one pgc-train job; returns (exit code, seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    options = run_options(exp, scheme, s, seed)
    (out / "run.toml").write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in options.items() if v is not None))
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


def aggregate(rows: list[RunSummary]) -> list[dict[str, Any]]:
    """Median over seeds of every figure, per (scheme, s)."""
    groups: dict[tuple[str, int], list[RunSummary]] = {}
    for r in rows:
        groups.setdefault((r.scheme, r.s), []).append(r)
    out = []
    for (scheme, s), runs in groups.items():
        row: dict[str, Any] = {"scheme": scheme, "s": "-" if scheme in S_FREE else s, "runs": len(runs)}
        for key in ("median_step_time", "step_time_vs_dgd", "steps_to_target", "time_to_target",
                    "final_test_accuracy", "utilization", "wasted_gradients", "bytes_per_step", "max_staleness",
                    "mean_staleness"):
            values = [getattr(r, key) for r in runs if getattr(r, key) is not None]
            row[key] = float(np.median(values)) if len(values) == len(runs) else None  # None: some never reached
        out.append(row)
    return out


def markdown_table(rows: list[dict[str, Any]], has_target: bool = True) -> str:
    """The aggregated results as a Markdown table."""
    head = ["scheme", "s", "median step (s)", "vs dgd", "steps to target", "time to target (s)",
            "final test acc", "utilization", "wasted grads", "MB recv/step", "max stale", "mean stale"]
    keys = ["scheme", "s", "median_step_time", "step_time_vs_dgd", "steps_to_target", "time_to_target",
            "final_test_accuracy", "utilization", "wasted_gradients", "bytes_per_step", "max_staleness",
            "mean_staleness"]

    def cell(key: str, v: Any) -> str:
        if v is None:
            return "not reached" if has_target and key in ("steps_to_target", "time_to_target") else "-"
        if key == "bytes_per_step":
            return f"{v / 1e6:.2f}"
        if key in ("steps_to_target", "wasted_gradients", "max_staleness"):
            return f"{v:.0f}"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(k, r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def run_dir_of(out: Path, scheme: str, s: int, seed: int) -> Path:
    """Where one run's outputs go."""
    return out / f"{scheme}-s{s}-seed{seed}"


def gather(exp: dict[str, Any], out: Path, todo: list[tuple[str, int, int]]) -> int:
    """Summarize the finished runs under `out` into results.csv, results.md and figures."""
    finished = {key: run_dir_of(out, *key) for key in todo if _completed(run_dir_of(out, *key))}
    missing = [key for key in todo if key not in finished]
    for scheme, s, seed in missing:
        print(f"no completed run for {scheme} s={s} seed={seed} in {out}", file=sys.stderr)
    if not finished:
        return 1
    dgd = {seed: summarize_run(d, None).median_step_time for (scheme, _, seed), d in finished.items()
           if scheme == "dgd"}
    rows = [summarize_run(d, exp["target_loss"], dgd.get(seed)) for (_, _, seed), d in finished.items()]
    with (out / "results.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0].as_row()))
        writer.writeheader()
        writer.writerows(r.as_row() for r in rows)
    target = exp["target_loss"]
    table = markdown_table(aggregate(rows), has_target=target is not None)
    (out / "results.md").write_text(
        f"# {exp['name']}\n\n{exp['workers']} workers; target loss {target if target is not None else '-'}; "
        f"median over seeds {exp['seeds']}; FR schemes decode: {exp['train'].get('fr_decode', 'covered')}; "
        f"options {exp['train']}\n\n{table}\n")
    print(table)
    from .plot import draw

    for f in draw(list(finished.values()), out):
        print(f)
    return 1 if missing else 0


def _completed(run_dir: Path) -> bool:
    """Whether a run directory holds a finished run (its summary record says completed)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return False
    from .metrics import read_metrics

    return any(r.get("event") == "summary" and r.get("status") == "completed" for r in read_metrics(path))


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
    for scheme, s, seed, reason in runs:
        if reason and not args.count:
            print(f"skipping {scheme} s={s} seed={seed}: {reason}", file=sys.stderr)
    todo = [(scheme, s, seed) for scheme, s, seed, reason in runs if reason is None]
    if args.count:
        print(len(todo))
        return 0
    if args.dry_run:
        for k, (scheme, s, seed) in enumerate(todo):
            print(f"{k}: {scheme} s={s} seed={seed}")
        return 0
    if args.gather:
        return gather(exp, out, todo)
    if args.run_index is not None and not 0 <= args.run_index < len(todo):
        print(f"pgc-bench: error: --run-index {args.run_index} is outside 0..{len(todo) - 1}", file=sys.stderr)
        return 2
    chosen = [todo[args.run_index]] if args.run_index is not None else todo
    failed = 0
    for k, (scheme, s, seed) in enumerate(chosen, start=1):
        run_dir = run_dir_of(out, scheme, s, seed)
        print(f"[{k}/{len(chosen)}] {scheme} s={s} seed={seed} ...", end=" ", flush=True)
        rc, took = run_one(exp, scheme, s, seed, run_dir)
        failed += rc != 0
        print(f"done in {took:.0f} s" if rc == 0 else f"FAILED (exit {rc}; see {run_dir / 'log.txt'})", flush=True)
    if args.run_index is not None:
        return 1 if failed else 0
    return 1 if gather(exp, out, todo) or failed else 0


if __name__ == "__main__":
    sys.exit(main())
