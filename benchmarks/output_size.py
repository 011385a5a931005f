"""Size of a run's outputs at scale: metrics.jsonl + messages.bin + config.json per step, simulated.

    python benchmarks/output_size.py --workers 1000 --steps 500 --schemes dgd,pgc-cr,pbs

Each scheme is simulated (logistic regression, n = --workers, s = 10, exponential delays of mean
1 s, 1 s per partition gradient) and its records are written as pgc-train and the simulator
backend write them (MetricsWriter, with its MessageLog); the bytes per step are extrapolated to
--per steps. Also printed: the size the same records took in metrics.jsonl alone before
messages.bin, and the CPU time of writing one step record both ways.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from pgc_mpi.config import SimConfig
from pgc_mpi.learning.problems import Logistic
from pgc_mpi.runs.message_log import NAME
from pgc_mpi.runs.metrics import MetricsWriter, _plain, json_line, write_json
from pgc_mpi.sim.simulator import simulate


def measure(scheme: str, args: argparse.Namespace) -> str:
    n = args.workers
    cfg = SimConfig(scheme=scheme, workers=n, stragglers=args.s, steps=args.steps, delay=args.delay, compute_time=1.0,
                    eval_every=100)
    began = time.perf_counter()
    res = simulate(cfg, Logistic(n, samples=20 * n, dim=20, batch_size=10, seed=0))
    simulated = time.perf_counter() - began
    steps = len(res.records)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        write_json(out / "config.json", {"config": cfg.__dict__, "workers": n})
        metrics = MetricsWriter(out)  # metrics.jsonl and messages.bin
        cpu = []
        for record in res.records:
            t0 = time.process_time()
            metrics.write(record)
            cpu.append(time.process_time() - t0)
        metrics.close()
        size = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
        before = []  # the same records as whole JSON lines, as metrics.jsonl held them before messages.bin
        with (out / "before.jsonl").open("w", buffering=1) as old:
            for record in res.records[:50]:
                t0 = time.process_time()
                old.write(json_line(record))
                old.flush()
                before.append(time.process_time() - t0)
    json_bytes = sum(len(json.dumps(_plain(r))) + 1 for r in res.records)
    per_step = (size["metrics.jsonl"] + size[NAME]) / steps
    total = per_step * args.per + size["config.json"]
    messages = sum(len(r["messages"]) for r in res.records) / steps
    return (f"| {scheme} | {messages:.0f} | {size['metrics.jsonl'] / steps:.0f} | {size[NAME] / steps / 1e3:.2f} | "
            f"{total / 1e6:.1f} | {json_bytes / steps * args.per / 1e6:.0f} | {np.median(cpu) * 1e3:.2f} | "
            f"{np.median(before) * 1e3:.2f} | {steps} in {simulated:.0f} s |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schemes", default="dgd,pgc-cr,pbs")
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("-s", type=int, default=10)
    p.add_argument("--delay", default="exp:1.0")
    p.add_argument("--steps", type=int, default=500, help="steps simulated")
    p.add_argument("--per", type=int, default=5000, help="steps the sizes are extrapolated to")
    args = p.parse_args()
    print(f"n = {args.workers}, s = {args.s}, delay {args.delay}; sizes extrapolated to {args.per} steps")
    print(f"| scheme | messages/step | metrics.jsonl B/step | messages.bin kB/step | outputs at {args.per} steps (MB) "
          f"| before: metrics.jsonl alone (MB) | write ms/step (CPU) | before: ms/step | steps simulated |")
    print("|---|---|---|---|---|---|---|---|---|")
    for scheme in args.schemes.split(","):
        print(measure(scheme, args), flush=True)


if __name__ == "__main__":
    main()
