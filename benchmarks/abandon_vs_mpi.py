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
in `--out` are reused, so an interrupted benchmark resumes. dgd and ddp never abandon: their rows
compare them with DropCompute at `--drop-compute` seconds instead (pgc_mpi.core.drop_compute).
ddp (torch's all-reduce, MPI only) is predicted by the simulator's dgd, the same step without
the server.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from abandon_late import add_problem_options, fresh_floor

from pgc_mpi.config import SimConfig
from pgc_mpi.core.traits import schemes_with
from pgc_mpi.learning.torch_problem import load_problem
from pgc_mpi.runs.results import read_steps, run_completed
from pgc_mpi.runs.stats import Interval, interval
from pgc_mpi.sim.simulator import simulate

CANDIDATES = ("dgd:0", "is-sgd:1", "pgc-fr:1", "pgc-fr:2", "pgc-cr:1", "pgc-cr:2")
DELAYS = ("exp:0.05", "markov:0.05:0.25:0.2")


def _common(args: argparse.Namespace, scheme: str, s: int, delay: str, seed: int) -> list[str]:
    return ["--scheme", scheme, "-s", str(s), "--dataset", args.dataset, "--model", args.model,
            "--batch-size", str(args.batch_size), "--accumulate", str(args.accumulate), "--lr", str(args.lr),
            "--steps", str(args.steps), "--delay", delay, "--compute-time", str(args.compute_time),
            "--seed", str(seed), "--max-staleness", args.max_staleness]


def _variant(args: argparse.Namespace, scheme: str, changed: bool) -> dict:
    """The settings of a run: as they are, or changed (--abandon-late; dgd: --drop-compute)."""
    if not changed:
        return {}
    return {"drop_compute": args.drop_compute} if scheme in schemes_with("drops_compute") else {"abandon_late": True}


def mpi_run(args: argparse.Namespace, out: Path, scheme: str, s: int, delay: str, seed: int,
            changed: bool) -> tuple[float, float, float]:
    """_means of one pgc-train run under mpiexec (reused when finished)."""
    if not run_completed(out):
        flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}")
                 for k, v in _variant(args, scheme, changed).items()]
        cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(args.workers + 1), sys.executable, "-m",
               "pgc_mpi", "train", *_common(args, scheme, s, delay, seed), "--eval-every", str(args.steps),
               "--out", str(out), "--overwrite", *flags]
        env = {**os.environ, "MPIEXEC_TIMEOUT": "600", "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=660)
        if done.returncode != 0:
            sys.exit(f"abandon_vs_mpi: {' '.join(cmd)} exited with {done.returncode}; its last output:\n"
                     + "\n".join((done.stdout + done.stderr).splitlines()[-30:]))
    records = read_steps(out)
    return _means(records)


def sim_run(args: argparse.Namespace, scheme: str, s: int, delay: str, seed: int,
            changed: bool) -> tuple[float, float, float]:
    """_means of the same run in the simulator (ddp's: dgd's)."""
    cfg = SimConfig(scheme="dgd" if scheme == "ddp" else scheme, workers=args.workers, stragglers=s,
                    steps=args.steps, lr=args.lr, accumulate=args.accumulate, delay=delay, seed=seed,
                    compute_time=args.compute_time, max_staleness=args.max_staleness,
                    eval_every=args.steps, **_variant(args, scheme, changed))
    result = simulate(cfg, load_problem(args.dataset, args.model, args.workers, args.batch_size, seed=seed))
    return _means(result.records)


def _means(records: list[dict]) -> tuple[float, float, float]:
    """(mean step, jobs abandoned per step, share of the micro-batches computed) of a run's records."""
    return (float(np.mean([r["step_time"] for r in records])), float(np.mean([r.get("abandoned", 0) for r in records])),
            float(np.mean([r.get("computed_share", 1.0) for r in records])))


def _fmt(i: Interval, digits: int = 3) -> str:
    return f"{i.mean:.{digits}f}" if i.k < 2 else f"{i.mean:.{digits}f} [{i.low:.{digits}f}, {i.high:.{digits}f}]"


def row(args: argparse.Namespace, delay: str, scheme: str, s: int) -> str:
    """One table row (markdown); progress on stderr."""
    got: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    drops = scheme in schemes_with("drops_compute")
    modes = (False, True) if not drops or args.drop_compute else (False,)
    for abandon in modes:
        for where in ("mpi", "sim"):
            got[where, abandon] = []
            for seed in args.seeds:
                suffix = ("" if not abandon else "-abandon" if not drops else f"-drop{args.drop_compute:g}")
                out = args.out / f"{delay.replace(':', '_')}-{scheme}-s{s}-seed{seed}{suffix}"
                value = (mpi_run(args, out, scheme, s, delay, seed, abandon) if where == "mpi" else
                         sim_run(args, scheme, s, delay, seed, abandon))
                got[where, abandon].append(value)
                print(f"{delay} {scheme} s={s} {where} abandon={abandon} seed {seed}: {value}", file=sys.stderr)
    steps = {k: [v[0] for v in vals] for k, vals in got.items()}
    floor = interval([fresh_floor("dgd" if drops else scheme, s, args.workers, delay, seed, args.compute_time,
                                  args.steps) for seed in args.seeds])
    finish = interval(steps["mpi", False])
    fit_finish = interval([m / p for m, p in zip(steps["mpi", False], steps["sim", False])])
    if ("mpi", True) not in steps:
        return f"| {delay} | {scheme} | - | {_fmt(finish)} | - | - | - | {_fmt(fit_finish)} | - | - | {_fmt(floor)} |"
    if drops:
        scheme = f"{scheme}, DropCompute {args.drop_compute:g} s"
    abandon = interval(steps["mpi", True])
    ratio = interval([a / f for a, f in zip(steps["mpi", True], steps["mpi", False])])
    predicted = interval([a / f for a, f in zip(steps["sim", True], steps["sim", False])])
    fit_abandon = interval([m / p for m, p in zip(steps["mpi", True], steps["sim", True])])
    what = 2 if drops else 1  # dgd, ddp: the share computed; the others: jobs abandoned
    dropped = (f"{np.mean([v[what] for v in got['mpi', True]]):.2f} / "
               f"{np.mean([v[what] for v in got['sim', True]]):.2f}{' computed' if what == 2 else ''}")
    return (f"| {delay} | {scheme} | {s} | {_fmt(finish)} | {_fmt(abandon)} | {_fmt(ratio)} | {_fmt(predicted)} "
            f"| {_fmt(fit_finish)} | {_fmt(fit_abandon)} | {dropped} | {_fmt(floor)} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the MPI runs (reused runs resume)")
    p.add_argument("--candidates", default=",".join(CANDIDATES), help="scheme:s pairs")
    p.add_argument("--delays", default=",".join(DELAYS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    add_problem_options(p)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--drop-compute", type=float, default=None, help="DropCompute's threshold for the dgd rows")
    args = p.parse_args()
    print(f"{args.workers} workers, {args.model} on {args.dataset}, {args.batch_size} x {args.accumulate} "
          f"micro-batches per partition gradient, compute {args.compute_time} s per gradient, {args.steps} steps, "
          f"seeds {args.seeds}, --max-staleness {args.max_staleness}; mean [95% interval] over the seeds; "
          f"step times in seconds\n")
    print("| delay | scheme | s | MPI mean step: finish | abandon | ratio | simulated ratio | MPI / sim: finish "
          "| abandon | abandoned per step (dgd, ddp: share computed): MPI / sim | fresh-start floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for delay in args.delays.split(","):
        for candidate in args.candidates.split(","):
            scheme, s = candidate.split(":")
            print(row(args, delay, scheme, int(s)), flush=True)


if __name__ == "__main__":
    main()
