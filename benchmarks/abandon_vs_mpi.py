"""--abandon-late under MPI against the simulator's prediction, paired by seed.

    python benchmarks/abandon_vs_mpi.py --out /tmp/abandon-vs-mpi

For each delay model and candidate (scheme, s) it runs pgc-train under mpiexec on `--workers`
workers for `--steps` steps (each partition gradient emulated to take `--compute-time` seconds,
so that ranks sharing this machine's cores behave like cluster nodes), once finishing decided
steps and once with --abandon-late, on every seed; and simulates the same runs (pgc-sim's
simulator, same problem, seeds and delays). It prints, as means over the seeds with their 95%
intervals: the mean step of both under MPI, their ratio (abandon / finish, paired by seed), the
simulator's ratio, MPI's mean step over the simulator's for both (the simulator charges the
master nothing, so above 1 by the master's own work), the jobs abandoned per step under MPI and
in the simulator, and the fresh-start floor (benchmarks/abandon_late.py). Runs already finished
in `--out` are reused, so an interrupted benchmark resumes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from abandon_late import fresh_floor

from pgc_mpi.config import SimConfig
from pgc_mpi.learning.models import load_problem
from pgc_mpi.runs.results import read_steps, run_completed
from pgc_mpi.runs.stats import Interval, interval
from pgc_mpi.sim.simulator import simulate

CANDIDATES = ("dgd:1", "is-sgd:1", "pgc-fr:1", "pgc-fr:2", "pgc-cr:1", "pgc-cr:2")
DELAYS = ("exp:0.05", "markov:0.05:0.25:0.2")


def _common(args: argparse.Namespace, scheme: str, s: int, delay: str, seed: int) -> list[str]:
    return ["--scheme", scheme, "-s", str(s), "--dataset", args.dataset, "--model", args.model,
            "--batch-size", str(args.batch_size), "--accumulate", str(args.accumulate), "--lr", str(args.lr),
            "--steps", str(args.steps), "--delay", delay, "--compute-time", str(args.compute_time),
            "--seed", str(seed)]


def mpi_run(args: argparse.Namespace, out: Path, scheme: str, s: int, delay: str, seed: int,
            abandon: bool) -> tuple[float, float]:
    """(mean step, jobs abandoned per step) of one pgc-train run under mpiexec (reused when finished)."""
    if not run_completed(out):
        cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(args.workers + 1), sys.executable, "-m",
               "pgc_mpi", "train", *_common(args, scheme, s, delay, seed), "--eval-every", str(args.steps),
               "--out", str(out), "--overwrite", *(["--abandon-late"] if abandon else [])]
        env = {**os.environ, "MPIEXEC_TIMEOUT": "600", "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=660)
    records = read_steps(out)
    return (float(np.mean([r["step_time"] for r in records])),
            float(np.mean([r.get("abandoned", 0) for r in records])))


def sim_run(args: argparse.Namespace, scheme: str, s: int, delay: str, seed: int,
            abandon: bool) -> tuple[float, float]:
    """(mean step, jobs abandoned per step) of the same run in the simulator."""
    cfg = SimConfig(scheme=scheme, workers=args.workers, stragglers=s, steps=args.steps, lr=args.lr,
                    accumulate=args.accumulate, delay=delay, seed=seed, compute_time=args.compute_time,
                    eval_every=args.steps, abandon_late=abandon)
    result = simulate(cfg, load_problem(args.dataset, args.model, args.workers, args.batch_size, seed=seed))
    return (float(np.mean([r["step_time"] for r in result.records])),
            float(np.mean([r.get("abandoned", 0) for r in result.records])))


def _fmt(i: Interval, digits: int = 3) -> str:
    return f"{i.mean:.{digits}f}" if i.k < 2 else f"{i.mean:.{digits}f} [{i.low:.{digits}f}, {i.high:.{digits}f}]"


def row(args: argparse.Namespace, delay: str, scheme: str, s: int) -> str:
    """One table row (markdown); progress on stderr."""
    got: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    modes = (False,) if scheme == "dgd" else (False, True)  # dgd never abandons: the flag changes nothing
    for abandon in modes:
        for where in ("mpi", "sim"):
            got[where, abandon] = []
            for seed in args.seeds:
                out = args.out / f"{delay.replace(':', '_')}-{scheme}-s{s}-seed{seed}{'-abandon' if abandon else ''}"
                value = (mpi_run(args, out, scheme, s, delay, seed, abandon) if where == "mpi" else
                         sim_run(args, scheme, s, delay, seed, abandon))
                got[where, abandon].append(value)
                print(f"{delay} {scheme} s={s} {where} abandon={abandon} seed {seed}: {value}", file=sys.stderr)
    steps = {k: [v[0] for v in vals] for k, vals in got.items()}
    floor = interval([fresh_floor(scheme, s, args.workers, delay, seed, args.compute_time, args.steps)
                      for seed in args.seeds])
    finish = interval(steps["mpi", False])
    fit_finish = interval([m / p for m, p in zip(steps["mpi", False], steps["sim", False])])
    if scheme == "dgd":
        return f"| {delay} | {scheme} | - | {_fmt(finish)} | - | - | - | {_fmt(fit_finish)} | - | - | {_fmt(floor)} |"
    abandon = interval(steps["mpi", True])
    ratio = interval([a / f for a, f in zip(steps["mpi", True], steps["mpi", False])])
    predicted = interval([a / f for a, f in zip(steps["sim", True], steps["sim", False])])
    fit_abandon = interval([m / p for m, p in zip(steps["mpi", True], steps["sim", True])])
    dropped = (f"{np.mean([v[1] for v in got['mpi', True]]):.2f} / "
               f"{np.mean([v[1] for v in got['sim', True]]):.2f}")
    return (f"| {delay} | {scheme} | {s} | {_fmt(finish)} | {_fmt(abandon)} | {_fmt(ratio)} | {_fmt(predicted)} "
            f"| {_fmt(fit_finish)} | {_fmt(fit_abandon)} | {dropped} | {_fmt(floor)} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the MPI runs (reused runs resume)")
    p.add_argument("--candidates", default=",".join(CANDIDATES), help="scheme:s pairs")
    p.add_argument("--delays", default=",".join(DELAYS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default="logreg")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--compute-time", type=float, default=0.05)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    print(f"{args.workers} workers, {args.model} on {args.dataset}, {args.batch_size} x {args.accumulate} "
          f"micro-batches per partition gradient, compute {args.compute_time} s per gradient, {args.steps} steps, "
          f"seeds {args.seeds}; mean [95% interval] over the seeds; step times in seconds\n")
    print("| delay | scheme | s | MPI mean step: finish | abandon | ratio | simulated ratio | MPI / sim: finish "
          "| abandon | abandoned per step: MPI / sim | fresh-start floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for delay in args.delays.split(","):
        for candidate in args.candidates.split(","):
            scheme, s = candidate.split(":")
            print(row(args, delay, scheme, int(s)), flush=True)


if __name__ == "__main__":
    main()
