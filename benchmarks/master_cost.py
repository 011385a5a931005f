"""The master's own cost per step under real MPI, against the number of workers and the model size.

    python benchmarks/master_cost.py --workers 8 16 32 64 --dims 100000 1000000 --out bench/master-cost

For every (N, d) it runs `pgc-train --problem quadratic --dim d` under mpiexec with N workers
(torch-free worker ranks, so 64 of them fit on one machine), emulated compute (--compute-time:
ranks that share cores behave like cluster nodes) and injected delays, then reads the master's
own work per step from the step records (receive, decode, update, send: see docs/outputs.md)
and compares the median step time with the simulator's for the same settings (whose master
takes no time). Printed: one markdown table row per (N, d), medians over the steps after the
first few (start-up), the simulated step time beside the measured one, the time from launch to
the first step and a worker rank's resident memory.

With --servers K the runs shard the parameters over K servers (pgc-train --servers): the table is
then server 0's (rank 0's) own work and bytes, and --fit is refused (the cost model is one master's).

With --fit FILE it then fits the master's cost model to these runs (pgc_mpi.sim.master_cost: each
part linear in N and the model size), writes it to FILE (what pgc-sim --master-cost reads) and
prints the simulator's step time with that model beside the measured one. --reuse takes the
runs already in --out instead of running them again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pgc_mpi.config import SimConfig
from pgc_mpi.learning.problems import PROBLEMS
from pgc_mpi.runs.metrics import MASTER_PARTS
from pgc_mpi.runs.results import read_steps
from pgc_mpi.sim.master_cost import fit, save
from pgc_mpi.sim.simulator import simulate

WARMUP = 3  # steps left out of the medians: the first models reach workers still starting up


def mpi_run(args: argparse.Namespace, n: int, dim: int, out: Path) -> tuple[list[dict], float]:
    """(step records, seconds from launch to the first step record) of one pgc-train run with n workers."""
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(n + args.servers), sys.executable, "-m", "pgc_mpi",
           "train", "--servers", str(args.servers),
           "--problem", "quadratic", "--dim", str(dim), "--samples", str(samples_for(args, n)), "--scheme", args.scheme,
           "-s", str(args.s),
           "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--steps", str(args.steps),
           "--eval-every", str(args.steps), "--delay", args.delay, "--compute-time", str(args.compute_time),
           "--seed", str(args.seed), "--dtype", "float32", "--overwrite", "--out", str(out)]
    if args.wire_dtype is not None:
        cmd += ["--wire-dtype", args.wire_dtype]
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(args.timeout), "OMP_NUM_THREADS": "1"}
    if not (args.reuse and (out / "config.json").exists()):
        out.mkdir(parents=True, exist_ok=True)
        launched = time.time()
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=args.timeout + 60)
        (out / "launched").write_text(f"{launched}\n")
    steps = read_steps(out)
    launched_file = out / "launched"
    start = steps[0]["time"] - float(launched_file.read_text()) if launched_file.exists() else float("nan")
    return steps, start


def samples_for(args: argparse.Namespace, n: int) -> int:
    """Training samples of the quadratic problem: --samples, or one minibatch per worker if that is more."""
    return max(args.samples, args.batch_size * n)


def worker_memory(out: Path, servers: int) -> float:
    """The median worker's resident MiB once its problem was built (config.json's provenance.ranks)."""
    ranks = json.loads((out / "config.json").read_text())["provenance"]["ranks"]
    return float(np.median([r["rss_mib"] for r in ranks[servers:]]))


def sim_times(args: argparse.Namespace, n: int, dim: int, master_cost: Path | None = None) -> tuple[float, float]:
    """The simulator's median step time and master time for the same settings (its master takes
    no time unless given a cost model)."""
    problem = PROBLEMS["quadratic"](n, samples=samples_for(args, n), dim=dim, batch_size=args.batch_size,
                                    seed=args.seed)
    cfg = SimConfig(scheme=args.scheme, workers=n, stragglers=args.s, steps=args.steps, lr=args.lr, delay=args.delay,
                    seed=args.seed, compute_time=args.compute_time, eval_every=args.steps, wire_dtype=args.wire_dtype,
                    master_cost=None if master_cost is None else str(master_cost))
    used = simulate(cfg, problem).records[WARMUP:]
    return (float(np.median([r["step_time"] for r in used])),
            float(np.median([sum(r[f"{part}_time"] for part in MASTER_PARTS) for r in used])))


def measured_row(n: int, dim: int, used: list[dict]) -> dict:
    """The master's median seconds per part in these steps: receive per message, the others per step."""
    row = {"workers": n, "numbers": dim}
    row["receive"] = float(np.median([r["receive_time"] / len(r["messages"]) for r in used if r["messages"]]))
    for part in MASTER_PARTS[1:]:
        row[part] = float(np.median([r[f"{part}_time"] for r in used]))
    return row


def report_fit(args: argparse.Namespace, rows: list[dict], measured_ms: list[tuple[float, float]]) -> None:
    """Fit the cost model to `rows`, save it to args.fit, and print the simulator's step time with it."""
    command = [a for a in sys.argv[1:] if a != "--reuse"]  # --reuse reads the runs this command made
    measured = {"command": "python benchmarks/master_cost.py " + " ".join(command),
                "date": time.strftime("%Y-%m-%d", time.gmtime()), "host": os.uname().nodename,
                "cpus": os.cpu_count(), "dtype": "float32", "scheme": args.scheme, "rows": rows}
    cost = fit(rows, measured)
    save(cost, args.fit)
    print(f"\ncost model fitted to these {len(rows)} runs, written to {args.fit} (seconds; M = million numbers):\n")
    print("| part | fixed ms | per worker ms | per M numbers ms |")
    print("|---|---|---|---|")
    for part in MASTER_PARTS:
        c = getattr(cost, part)
        print(f"| {part}{' (per message)' if part == 'receive' else ''} | {1e3 * c.fixed:.3f} "
              f"| {1e3 * c.per_worker:.4f} | {1e3 * c.per_mnum:.3f} |")
    print("\n| N | d | master ms | simulated master ms | step ms | simulated step ms, free master "
          "| simulated step ms, with the cost model |")
    print("|---|---|---|---|---|---|---|")
    cases = [(r["workers"], r["numbers"], ms) for r, ms in zip(rows, measured_ms)]
    cases += [(n, dim, None) for dim in args.extrapolate_dims for n in args.extrapolate]
    for n, dim, ms in cases:
        master, step = ("–", "–") if ms is None else (f"{ms[0]:.1f}", f"{ms[1]:.0f}")
        costly = sim_times(args, n, dim, args.fit)
        print(f"| {n} | {dim:,} | {master} | {1e3 * costly[1]:.1f} | {step} | {1e3 * sim_times(args, n, dim)[0]:.0f} "
              f"| {1e3 * costly[0]:.0f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--dims", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--scheme", default="pgc-cr")
    p.add_argument("-s", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--samples", type=int, default=1200, help="the quadratic problem's samples (pgc-train's default)")
    p.add_argument("--wire-dtype", default=None, help="pgc-train --wire-dtype of the runs (default: float32, the runs' "
                                                      "--dtype)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--delay", default="exp:0.1")
    p.add_argument("--compute-time", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--servers", type=int, default=1, help="pgc-train --servers of the runs (the table: server 0's)")
    p.add_argument("--timeout", type=int, default=900, help="seconds one mpiexec may take")
    p.add_argument("--out", type=Path, default=Path("bench/master-cost"))
    p.add_argument("--fit", type=Path, default=None, metavar="FILE",
                   help="fit the master's cost model to the runs and write it here (for pgc-sim --master-cost)")
    p.add_argument("--reuse", action="store_true", help="use the runs already in --out instead of running them")
    p.add_argument("--extrapolate", type=int, nargs="*", default=[],
                   help="with --fit: also simulate these numbers of workers (no MPI run), free and with the model")
    p.add_argument("--extrapolate-dims", type=int, nargs="+", default=[100_000],
                   help="model sizes of --extrapolate (the simulator holds every worker's gradients: 1,000 "
                        "workers at d = 1M would need about 8 GB per model version)")
    args = p.parse_args()
    if args.servers > 1 and args.fit is not None:
        p.error("--fit fits one master's cost: use it with --servers 1")
    parts = " | ".join(f"{part} ms" for part in MASTER_PARTS)
    print(f"{args.scheme}, s={args.s}, --compute-time {args.compute_time}, --delay {args.delay}, float32, "
          f"messages {args.wire_dtype or 'float32'}, --servers {args.servers}; "
          f"medians over steps {WARMUP}..{args.steps - 1}\n")
    print(f"| N | d | {parts} | master ms | step ms | simulated step ms | MB in per step | start s | worker MiB |")
    print("|" + "---|" * (len(MASTER_PARTS) + 8))
    rows, measured_ms = [], []
    for dim in args.dims:
        for n in args.workers:
            out = args.out / f"n{n}-d{dim}{f'-k{args.servers}' if args.servers > 1 else ''}"
            steps, start = mpi_run(args, n, dim, out)
            used = steps[WARMUP:]
            rows.append(measured_row(n, dim, used))
            part_ms = [1e3 * float(np.median([r[f"{part}_time"] for r in used])) for part in MASTER_PARTS]
            master = 1e3 * float(np.median([sum(r[f"{part}_time"] for part in MASTER_PARTS) for r in used]))
            step = 1e3 * float(np.median([r["step_time"] for r in used]))
            measured_ms.append((master, step))
            moved = np.diff([r["bytes_received"] for r in steps])[WARMUP - 1:]
            print(f"| {n} | {dim:,} | " + " | ".join(f"{v:.1f}" for v in part_ms)
                  + f" | {master:.1f} | {step:.0f} | {1e3 * sim_times(args, n, dim)[0]:.0f} "
                  f"| {float(np.median(moved)) / 1e6:.1f} | {start:.0f} | {worker_memory(out, args.servers):.0f} |",
                  flush=True)
    if args.fit is not None:
        report_fit(args, rows, measured_ms)


if __name__ == "__main__":
    main()
