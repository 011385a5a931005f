"""The pipelined schemes under a real recipe, with and without a staleness correction (simulated).

Each variant is one pgc-sim run per seed on the recipe of docs/BENCHMARKS.md §20 (the CNN on
Fashion-MNIST, 12 workers, batch 16 per gradient, 300 steps, compute 0.1 s, evaluations every 20
steps on the test split); the delays, partitioning and s are options. Per variant: how many seeds
reach --target test accuracy, simulated time and steps to it, the final test accuracy, the 90th
percentile of the decoded gradient's norm and the share of steps clipped, and the time to the
target as a ratio to --baseline's run of the same seed (paired; a run that never reaches the target
has no ratio, and its row says so). Runs go two at a time (the simulator is one process each).

    python -m data_prep fashion-mnist --out data/fashion-mnist.h5
    python benchmarks/staleness_sim.py --s 2 --seeds 0 1 2 --out bench/staleness/s2-iid
    python benchmarks/staleness_sim.py --s 2 --seeds 0 1 2 --out bench/staleness/s2-iid --reuse   # the table again

A variant is LABEL=SCHEME[:OPTION=VALUE...]: `pgc-fr:staleness-correction=weights:0.3`,
`dgd:workers=4` (dgd on n/c partitions: pgc-fr's fresh batch without its staleness), `pgc-fr:lr=0.05`.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from pgc_mpi.runs.stats import interval, paired_ratio

RECIPES = {
    # §20's: torch SGD, Nesterov 0.9, weight decay 5e-4, warm-up 30 then cosine, clipping at 2.0
    "nesterov": ["--optimizer", "nesterov", "--momentum", "0.9", "--lr", "0.1", "--weight-decay", "5e-4",
                 "--lr-schedule", "cosine", "--warmup-steps", "30", "--clip-grad-norm", "2.0"],
    # AdamW, warm-up 30 then linear decay, clipping at 1.0
    "adamw": ["--optimizer", "adamw", "--lr", "0.002", "--weight-decay", "0.01", "--lr-schedule", "linear",
              "--warmup-steps", "30", "--clip-grad-norm", "1.0"],
}
CLIP = {"nesterov": 2.0, "adamw": 1.0}
DEFAULT_VARIANTS = [
    "dgd=dgd", "is-sgd=is-sgd", "dgd n/c=dgd:workers=N/C",
    "pgc-fr=pgc-fr:staleness-correction=none", "pgc-fr w0.5=pgc-fr:staleness-correction=weights:0.5",
    "pgc-fr w0.3=pgc-fr:staleness-correction=weights:0.3", "pgc-fr w0=pgc-fr:staleness-correction=weights:0",
    "pgc-fr lr/τ=pgc-fr:staleness-correction=none:lr=LR/TAU",
    "pgc-cr=pgc-cr:staleness-correction=none", "pgc-cr w0.5=pgc-cr:staleness-correction=weights:0.5",
    "pgc-cr w0.3=pgc-cr:staleness-correction=weights:0.3", "pgc-cr w0=pgc-cr:staleness-correction=weights:0",
    "pgc-cr lr/τ=pgc-cr:staleness-correction=none:lr=LR/TAU",
]


def parse_variant(text: str, a: argparse.Namespace) -> tuple[str, str, dict[str, str]]:
    """(label, scheme, {option: value}) of LABEL=SCHEME[:OPTION=VALUE...]; N/C and LR/TAU are
    the workers over c = s + 1 and the recipe's lr over the mean delay 1 + s/2 of pgc's buffers."""
    label, _, spec = text.partition("=")
    scheme, *pairs = spec.split(":")
    options: dict[str, str] = {}
    for pair in pairs:
        if "=" in pair:
            key, value = pair.split("=", 1)
            options[key] = value
        else:  # a value holding a colon (weights:0.3): the previous option's
            options[key] += ":" + pair
    lr = float(RECIPES[a.recipe][RECIPES[a.recipe].index("--lr") + 1])
    for key, value in options.items():
        value = value.replace("N/C", str(a.workers // (a.s + 1))).replace("LR/TAU", f"{lr / (1 + a.s / 2):.6g}")
        options[key] = value
    return label, scheme, options


def command(a: argparse.Namespace, scheme: str, options: dict[str, str], seed: int, out: Path) -> list[str]:
    """The pgc-sim command line of one variant and seed."""
    args = ["pgc-sim", "--schemes", scheme, "-s", str(a.s), "-n", str(a.workers), "--model", "cnn",
            "--dataset", a.dataset, "--batch-size", "16", "--steps", str(a.steps), *RECIPES[a.recipe],
            "--compute-time", "0.1", "--delay", a.delay, "--partitioning", a.partitioning,
            "--eval-every", "20", "--no-eval-train", "--seed", str(seed), "--seeds", "1", "--threads", "1",
            "--out", str(out)]
    for key, value in options.items():
        flag = "-n" if key == "workers" else f"--{key}"
        if flag in args:  # the variant's own value replaces the recipe's
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return args


def summarize(path: Path, target: float, clip: float) -> dict[str, Any]:
    """One run's figures from its pgc-sim records."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in records if "event" not in r]
    evals = [r for r in records if r.get("event") == "eval"]
    hit = next((e for e in evals if e["test_accuracy"] >= target), None)
    norms = [r["grad_norm"] for r in steps]
    return {"time": hit["wall_time"] if hit else math.nan, "steps": hit["step"] + 1 if hit else math.nan,
            "final": evals[-1]["test_accuracy"], "norm_p90": float(np.percentile(norms, 90)),
            "clipped": float(np.mean([v > clip for v in norms]))}


def ci(values: list[float], digits: int = 3) -> str:
    iv = interval(values)
    if iv.k == 0:
        return "-"
    return f"{iv.mean:.{digits}g}" if iv.k < 2 else f"{iv.mean:.{digits}g} [{iv.low:.{digits}g}, {iv.high:.{digits}g}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    p.add_argument("--baseline", default="is-sgd", help="label of the variant the time ratios are to")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("-s", "--s", type=int, default=2)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--recipe", choices=sorted(RECIPES), default="nesterov")
    p.add_argument("--delay", default="exp:0.1")
    p.add_argument("--partitioning", default="iid")
    p.add_argument("--target", type=float, default=0.86, help="test accuracy")
    p.add_argument("--dataset", default="data/fashion-mnist.h5")
    p.add_argument("--jobs", type=int, default=2, help="pgc-sim runs at once")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reuse", action="store_true", help="keep the runs already in --out")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    variants = [parse_variant(v, a) for v in a.variants]
    todo = []
    for seed in a.seeds:
        for label, scheme, options in variants:
            path = a.out / f"{label.replace(' ', '_').replace('/', '-')}.seed{seed}.jsonl"
            if not (a.reuse and path.exists()):
                todo.append((command(a, scheme, options, seed, path), path))

    def run(job: tuple[list[str], Path]) -> None:
        args, path = job
        proc = subprocess.run(args, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            path.unlink(missing_ok=True)
            sys.exit(f"failed: {' '.join(args)}\n{proc.stderr[-2000:]}")
        print(f"done {path.name}", flush=True)

    with ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(run, todo))
    clip = CLIP[a.recipe]
    runs = {label: {k: summarize(a.out / f"{label.replace(' ', '_').replace('/', '-')}.seed{k}.jsonl", a.target, clip)
                    for k in a.seeds} for label, _, _ in variants}
    base = runs[a.baseline]
    print(f"\nrecipe {a.recipe}, {a.workers} workers, s = {a.s}, delay {a.delay}, partitioning {a.partitioning}, "
          f"target test accuracy {a.target}; seeds {a.seeds}; mean [95% interval]; simulated seconds; "
          f"time ratio to {a.baseline} paired by seed over the seeds both reach the target\n")
    print(f"| variant | reached | time to target | steps to target | time vs {a.baseline} | final test acc "
          f"| decoded norm p90 | steps clipped |")
    print("|---|---|---|---|---|---|---|---|")
    for label, _, _ in variants:
        r = runs[label]
        reached = sum(math.isfinite(r[k]["time"]) for k in a.seeds)
        ratio = paired_ratio([r[k]["time"] for k in a.seeds], [base[k]["time"] for k in a.seeds])
        shown = "-" if ratio.k == 0 else (f"{ratio.mean:.3g}" if ratio.k < 2 else
                                          f"{ratio.mean:.3g} [{ratio.low:.3g}, {ratio.high:.3g}]")
        print(f"| {label} | {reached}/{len(a.seeds)} | {ci([r[k]['time'] for k in a.seeds])} "
              f"| {ci([r[k]['steps'] for k in a.seeds])} | {shown} | {ci([r[k]['final'] for k in a.seeds], 4)} "
              f"| {ci([r[k]['norm_p90'] for k in a.seeds])} | {np.mean([r[k]['clipped'] for k in a.seeds]):.0%} |")
    print("\nper seed: final test accuracy (steps to target)")
    for label, _, _ in variants:
        print(f"  {label}: " + ", ".join(f"seed {k} {runs[label][k]['final']:.4f} ({runs[label][k]['steps']:g})"
                                          for k in a.seeds))


if __name__ == "__main__":
    main()
