"""Does rounding gradient messages to a narrower wire format slow training down? Real data, seeds.

    python benchmarks/wire_dtype.py --dataset data/fashion-mnist.h5 --model mlp --seeds 0 1 2 3 4

Every (scheme, seed) is simulated (pgc_mpi.simulate: the torch model on the real data set, every
gradient really computed; the time is simulated) once per wire format (pgc-train --wire-dtype:
float32, bfloat16, float16 messages; float64 model and master), with the same delays, partitions
and minibatches, so the runs of one seed differ only in the rounding. Printed per scheme and wire
format: steps to the target loss under the evaluated-loss rule, the final test accuracy and
training loss, means with 95% confidence intervals over the seeds, and the steps paired seed by
seed against float32's, and the steps' estimated rounding error (`wire_error`). The bytes a
step moves scale with the format's size (2 bytes instead of 4); what that saves in the master's
time is measured by benchmarks/runtime_limits.py --wire-dtypes (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics

from pgc_mpi.config import SimConfig
from pgc_mpi.core.wire import WIRE_DTYPES
from pgc_mpi.learning.torch_problem import load_problem
from pgc_mpi.runs.stats import interval
from pgc_mpi.sim.simulator import simulate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default="logreg")
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("-s", type=int, default=1)
    p.add_argument("--schemes", nargs="+", default=["dgd", "gc-cr", "pgc-cr"])
    p.add_argument("--wire", nargs="+", default=list(WIRE_DTYPES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--delay", default="exp:1.0")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--target-loss", type=float, default=0.6)
    args = p.parse_args()
    print(f"{args.model} on {args.dataset}, {args.workers} workers, s = {args.s}, --delay {args.delay}, lr {args.lr}, "
          f"batch {args.batch_size}, {args.steps} steps, seeds {args.seeds}; simulated, float64 master; target "
          f"training loss {args.target_loss} (evaluated every {args.eval_every} steps); 95% CIs over seeds\n")
    print("| scheme | wire | steps to target | steps / float32's (paired) | final test accuracy | final training loss "
          "| runs reaching the target | wire_error median / max |")
    print("|---|---|---|---|---|---|---|---|")
    for scheme in args.schemes:
        runs: dict[str, list] = {wire: [] for wire in args.wire}
        for seed in args.seeds:
            problem = load_problem(args.dataset, args.model, args.workers, args.batch_size, seed=seed, dtype="float64")
            base = SimConfig(scheme=scheme, workers=args.workers, stragglers=args.s, steps=args.steps, lr=args.lr,
                             delay=args.delay, seed=seed, eval_every=args.eval_every)
            for wire in args.wire:
                res = simulate(dataclasses.replace(base, wire_dtype=wire), problem)
                hit = res.first_below(res.loss_key, args.target_loss)
                runs[wire].append((hit["step"] + 1 if hit else math.nan, res.final("test_accuracy"),
                                   res.final(res.loss_key), [r["wire_error"] for r in res.records]))
        reference = [r[0] for r in runs[args.wire[0]]]
        for wire in args.wire:
            steps = [r[0] for r in runs[wire]]
            ratio = [a / b for a, b in zip(steps, reference) if math.isfinite(a) and math.isfinite(b)]
            reached = sum(math.isfinite(v) for v in steps)
            errors = [e for r in runs[wire] for e in r[3]]  # every step's estimate (pgc_mpi.core.wire.decode_error)
            print(f"| {scheme} | {wire} | {interval(steps)} | {interval(ratio)} | "
                  f"{interval([r[1] for r in runs[wire]])} | {interval([r[2] for r in runs[wire]])} "
                  f"| {reached}/{len(steps)} | {statistics.median(errors):.2g} / {max(errors):.2g} |", flush=True)


if __name__ == "__main__":
    main()
