"""The simulator against the MPI runtime: same model, data, seed, delays and --compute-time.

    python benchmarks/sim_vs_mpi.py --schemes dgd,gc-cr,pgc-fr,pgc-cr --seeds 0 1 2

For each scheme and seed it runs `pgc-train` under mpiexec with --compute-time (so the ranks
sharing this machine's cores behave like cluster nodes) and `pgc_mpi.simulate` with the same
settings and compute_time, then compares the median step time and the full training loss at
the evaluation steps. What the simulator leaves out (the master's decode and update, message
transfer, polling) shows up as the MPI run's extra step time; the losses differ where timing
noise changes which workers arrive first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pgc_mpi.config import SimConfig
from pgc_mpi.learning.torch_problem import load_problem
from pgc_mpi.runs.metrics import read_metrics
from pgc_mpi.sim.simulator import SimResult, simulate


def mpi_run(args: argparse.Namespace, scheme: str, seed: int, out: Path) -> tuple[list[dict], list[dict]]:
    """(step records, eval records) of one pgc-train run."""
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(args.workers + 1), sys.executable, "-m",
           "pgc_mpi", "train", "--scheme", scheme, "-s", str(args.s), "--dataset", args.dataset, "--model",
           args.model, "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--steps", str(args.steps),
           "--eval-every", str(args.eval_every), "--delay", args.delay, "--compute-time", str(args.compute_time),
           "--seed", str(seed), "--out", str(out)]
    env = {**os.environ, "MPIEXEC_TIMEOUT": "900", "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=960)
    records = read_metrics(out / "metrics.jsonl")
    return [r for r in records if "event" not in r], [r for r in records if r.get("event") == "eval"]


def sim_run(args: argparse.Namespace, scheme: str, seed: int) -> SimResult:
    """The same run in the simulator."""
    problem = load_problem(args.dataset, args.model, args.workers, args.batch_size, seed=seed)
    cfg = SimConfig(scheme=scheme, workers=args.workers, stragglers=args.s, steps=args.steps, lr=args.lr,
                    delay=args.delay, seed=seed, compute_time=args.compute_time, eval_every=args.eval_every)
    return simulate(cfg, problem)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schemes", default="dgd,gc-cr,pgc-fr,pgc-cr")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("-s", type=int, default=1)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default="logreg")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--delay", default="exp:0.05")
    p.add_argument("--compute-time", type=float, default=0.05)
    args = p.parse_args()
    print(f"{args.workers} workers, s={args.s}, {args.dataset}/{args.model}, batch {args.batch_size}, lr {args.lr}, "
          f"{args.steps} steps, delay {args.delay}, --compute-time {args.compute_time}")
    print("| scheme | seed | median step MPI (s) | median step sim (s) | MPI / sim | train loss at evals, MPI | sim |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in args.schemes.split(","):
            for seed in args.seeds:
                steps, evals = mpi_run(args, scheme, seed, Path(tmp) / f"{scheme}-{seed}")
                sim = sim_run(args, scheme, seed)
                mpi_median = float(np.median([r["step_time"] for r in steps]))
                sim_median = sim.median_step_time()
                ratios.append(mpi_median / sim_median)
                at = {e["step"]: e["train_loss"] for e in evals}
                sim_at = {e["step"]: e["train_loss"] for e in sim.evals if e["step"] in at}
                losses = " / ".join(f"{at[k]:.4f}" for k in sorted(at))
                sim_losses = " / ".join(f"{sim_at[k]:.4f}" for k in sorted(at) if k in sim_at)
                print(f"| {scheme} | {seed} | {mpi_median:.4f} | {sim_median:.4f} | {mpi_median / sim_median:.3f} | "
                      f"{losses} | {sim_losses} |", flush=True)
    print(f"MPI / sim median step time: mean {np.mean(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
