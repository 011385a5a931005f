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
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..choices import BUILTIN_DATASETS
from ..config import TrainConfig, tomllib
from ..core.traits import PEER_SCHEMES, SCHEME_NAMES, schemes_with
from ..errors import ConfigError, PgcError
from ..learning.plugins import is_spec
from ..runs import run_lock
from ..runs.results import run_completed
from .bench_results import S_FREE, RunKey, aggregate, gather, run_dir_of, winners

__all__ = ["aggregate", "gather", "load_experiment", "main", "plan", "run_dir_of", "run_one", "winners"]

EXPERIMENT_KEYS = {"name": str, "workers": int, "schemes": list, "s": list, "seeds": list, "target_loss": float,
                   "timeout": int, "launcher": str, "is_gc_c": int, "train": dict, "per_scheme": dict,
                   "delays": list, "backend": str}
BACKENDS = ("mpi", "sim")


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


def run_options(exp: dict[str, Any], key: RunKey) -> dict[str, Any]:
    """The pgc-train options of one run."""
    options = {**exp["train"], **exp.get("per_scheme", {}).get(key.scheme, {}), "scheme": key.scheme,
               "stragglers": key.s, "seed": key.seed, "delay": exp["delays"][key.delay]}
    # is_gc_c: the c of the schemes that take one, but pbs (whose c is its window)
    if key.scheme in set(schemes_with("sets_c")) - set(schemes_with("table")) and exp["is_gc_c"] is not None:
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
    """Launch one pgc-train job (or simulate it) in its folder `out`, which it holds locked
    meanwhile (pgc_mpi.runs.run_lock: ConfigError when another run uses it); returns (exit
    code, seconds)."""
    lock = run_lock.acquire(out, "pgc-bench", flag="run folder")
    try:
        (out / "run.toml").write_text(run_toml(exp, key))
        if exp["backend"] == "sim":
            return _simulate_one(exp, key, out)
        return _launch(exp, out, lock.token)
    finally:
        lock.release()


def _launch(exp: dict[str, Any], out: Path, lock: str) -> tuple[int, float]:
    """pgc-train on the run's run.toml, under the launcher, inheriting the folder's lock."""
    ranks = exp["workers"] + 1
    launcher = shlex.split(exp["launcher"].format(ranks=ranks))
    local = Path(sys.executable).parent / launcher[0]
    if local.exists():  # the venv's own mpiexec, matching its mpi4py
        launcher[0] = str(local)
    cmd = [*launcher, sys.executable, "-m", "pgc_mpi", "train", "--config", str(out / "run.toml"), "--out", str(out)]
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(exp["timeout"]), "OMP_NUM_THREADS": "1", run_lock.INHERIT: lock}
    began = time.monotonic()
    with (out / "log.txt").open("w") as log:
        rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=exp["timeout"] + 60).returncode
    return rc, time.monotonic() - began


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


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-bench`."""
    args = _parser().parse_args(argv)
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
    try:
        failed = _run_each(exp, out, chosen, reusable)
    except PgcError as exc:  # a run's folder is another run's now: this campaign must not write there
        print(f"\npgc-bench: error: {exc}", file=sys.stderr)
        return 2
    if args.run_index is not None:
        return 1 if failed else 0
    return 1 if gather(exp, out, todo) or failed else 0


def _parser() -> argparse.ArgumentParser:
    """pgc-bench's command line: the experiment, --out, and at most one of the modes."""
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
    return p


def _run_each(exp: dict[str, Any], out: Path, chosen: list[RunKey], reusable: set[RunKey]) -> int:
    """Run the chosen runs one after another, a progress line each (those finished before are
    reused, not run again); returns how many failed. PgcError, at once, for a run whose folder
    is another run's."""
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
    return failed


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
