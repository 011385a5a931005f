"""Time to a test-accuracy target with a real training recipe on real data, per scheme, paired by
seed; beside it, a plain single-process torch loop with the same recipe.

pgc-train runs the built-in cnn on Fashion-MNIST under MPI (N workers + a master, emulated
compute and exponential delays) with an optimizer factory (SGD, Nesterov momentum, weight decay on
the weights only: benchmarks/recipe_factories.py), a linear warm-up then cosine decay, and global
gradient-norm clipping. Every scheme runs with every seed (same data, partitions, minibatches
and delay draws within a seed). Per scheme it reports, as means with 95% intervals over the
seeds: the training time to the first evaluation whose test accuracy reaches --target (the
step record's wall_time, which leaves evaluations out), the steps to it, the median step time,
the final test accuracy, and the ratios of time and steps to dgd's run of the same seed; and
the real compute per gradient against --compute-time (the emulation is sound only while the
real part stays well below it). The plain loop trains the same model (same seed, so the same
initial weights), optimizer factory, schedule and clipping on minibatches of N x --batch-size
drawn from the whole training set, for as many steps as dgd (so as many samples), and reports
its test accuracy at the same evaluations.

    python -m data_prep fashion-mnist --out data/fashion-mnist.h5
    python benchmarks/recipe_time_to_accuracy.py --probe 30                 # the real compute alone
    python benchmarks/recipe_time_to_accuracy.py --seeds 0 1 2 --out bench/recipe-tta
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from pgc_mpi.runs.results import read_steps, run_completed
from pgc_mpi.runs.stats import interval

HERE = Path(__file__).resolve().parents[1]
DEFAULT_SCHEMES = ["dgd", "ddp", "pgc-cr:1", "pgc-fr:1", "pgc-fr:2", "pgc-cr:2"]


def parse_scheme(text: str) -> tuple[str, int]:
    """'pgc-cr:2' -> ('pgc-cr', 2); 'dgd' -> ('dgd', 1)."""
    name, _, s = text.partition(":")
    return name, int(s) if s else 1


def label(scheme: str, s: int) -> str:
    return scheme if scheme in ("dgd", "ddp") else f"{scheme} s={s}"


def train_args(a: argparse.Namespace, scheme: str, s: int, seed: int, steps: int, out: Path) -> list[str]:
    """pgc-train's flags for one run."""
    args = ["--scheme", scheme, "-s", str(s), "--seed", str(seed), "--dataset", a.dataset, "--model", "cnn",
            "--batch-size", str(a.batch_size), "--steps", str(steps), "--optimizer", a.optimizer,
            "--lr", str(a.lr), "--lr-schedule", "cosine", "--warmup-steps", str(a.warmup_steps),
            "--clip-grad-norm", str(a.clip_grad_norm), "--compute-time", str(a.compute_time),
            "--delay", a.delay, "--eval-every", str(a.eval_every), "--no-eval-train", "--log-interval", "60",
            "--out", str(out), "--overwrite"]
    return args + a.extra


def run_one(a: argparse.Namespace, scheme: str, s: int, seed: int, steps: int, out: Path) -> float:
    """Run pgc-train once (bounded: MPIEXEC_TIMEOUT and the subprocess's timeout); its wall time."""
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(a.timeout), "OMP_NUM_THREADS": "1"}
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    cmd = [mpiexec, "-n", str(a.workers + 1), sys.executable, "-m", "pgc_mpi", "train",
           *train_args(a, scheme, s, seed, steps, out)]
    out.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with open(out.parent / f"{out.name}.log", "w") as log:
        result = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=HERE, timeout=a.timeout + 60)
    took = time.monotonic() - began
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {result.returncode}; see {out.parent / out.name}.log")
    return took


def summarize(run_dir: Path, target: float, clip: float) -> dict[str, Any]:
    """One run's figures: steps and training time to the target, median step, final accuracy, the
    real compute per gradient (median and 99th percentile over every message), the test-accuracy
    curve."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in records if r.get("event") == "eval"]
    summary = [r for r in records if r.get("event") == "summary"][-1]
    steps = read_steps(run_dir)
    wall = {r["step"]: r["wall_time"] for r in steps}
    hit = next((e for e in evals if e["test_accuracy"] >= target), None)
    real = [m[6] for r in steps for m in r.get("messages", []) if len(m) > 6 and m[6] == m[6]]
    # m: [worker, step, delay, compute_time, gradients, verdict, real_compute_time]; per gradient
    per_gradient = [m[6] / m[4] for r in steps for m in r.get("messages", [])
                    if len(m) > 6 and m[4] and m[6] == m[6]]
    return {
        "steps_to_target": hit["step"] + 1 if hit else math.nan,
        "time_to_target": wall[hit["step"]] if hit else math.nan,
        "median_step": float(summary["median_step_time"]),
        "final_accuracy": float(evals[-1]["test_accuracy"]),
        "real_compute_median": float(np.median(per_gradient)) if per_gradient else math.nan,
        "real_compute_p99": float(np.percentile(per_gradient, 99)) if per_gradient else math.nan,
        "messages": len(real),
        "max_staleness": max((r.get("max_staleness", 0) for r in steps), default=0),
        "curve": [(e["step"] + 1, e["test_accuracy"]) for e in evals],
        "clipped": float(np.mean([r["grad_norm"] > clip for r in steps])),
        "wall": steps[-1]["wall_time"],
    }


def plain_loop(a: argparse.Namespace, seed: int, steps: int,
               look: Any = None) -> tuple[list[tuple[int, float]], float]:
    """The same recipe in one process: the cnn seeded as pgc-train seeds it, the optimizer factory,
    the built-in warm-up + cosine schedule (pgc_mpi's own schedule_factor under LambdaLR, as the
    master applies it), torch's clip_grad_norm_, minibatches of workers x batch-size from the
    whole training set (a fresh permutation every pass). Returns (steps, test accuracy) at every
    evaluation, and the fraction of steps whose gradient norm exceeded the clip. `look(t, model,
    x, y, lr)`, if given, is called before each step t (benchmarks/hessian_top.py looks at the
    curvature there)."""
    import torch

    from pgc_mpi import build_model
    from pgc_mpi.learning.datasets import open_dataset
    from pgc_mpi.learning.optim import Recipe, schedule_factor
    from pgc_mpi.learning.plugins import load_object

    torch.set_num_threads(a.plain_threads)
    source = open_dataset(a.dataset)
    x, y = (torch.as_tensor(v) for v in source.read_split("train"))
    xt, yt = (torch.as_tensor(v) for v in source.read_split("test"))
    x, xt, y, yt = x.float(), xt.float(), y.long(), yt.long()
    torch.manual_seed(seed)
    model = build_model("cnn", tuple(x.shape[1:]), int(source.info.num_classes))
    opt = load_object(a.optimizer, "--optimizer")(model)
    recipe = Recipe(lr=a.lr, lr_schedule="cosine", warmup_steps=a.warmup_steps, steps=steps,
                    clip_grad_norm=a.clip_grad_norm)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule_factor(recipe))
    batch = a.workers * a.batch_size
    rng = np.random.default_rng([seed, 0x91A1])
    order = np.empty(0, dtype=np.int64)
    curve, norms = [], []
    for t in range(steps):
        while len(order) < batch:
            order = np.concatenate([order, rng.permutation(len(y))])
        rows, order = torch.from_numpy(order[:batch]), order[batch:]
        if look is not None:
            look(t, model, x, y, opt.param_groups[0]["lr"])
        model.train()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad_norm)))
        opt.step()
        sched.step()
        if (t + 1) % a.eval_every == 0 or t + 1 == steps:
            model.eval()
            with torch.no_grad():
                correct = sum(int((model(xt[i:i + 2000]).argmax(1) == yt[i:i + 2000]).sum())
                              for i in range(0, len(yt), 2000))
            curve.append((t + 1, correct / len(yt)))
    return curve, float(np.mean(np.array(norms) > a.clip_grad_norm))


def first_at(curve: list[tuple[int, float]], target: float) -> float:
    return next((float(k) for k, acc in curve if acc >= target), math.nan)


def probe(a: argparse.Namespace) -> None:
    """One short dgd run: the real compute per gradient against --compute-time."""
    out = Path(a.out) / "probe"
    took = run_one(a, "dgd", 1, 0, a.probe, out)
    r = summarize(out, a.target, a.clip_grad_norm)
    print(f"probe: dgd, {a.workers} workers, {a.probe} steps, batch {a.batch_size}, --compute-time {a.compute_time}: "
          f"real compute per gradient median {1e3 * r['real_compute_median']:.1f} ms, 99th percentile "
          f"{1e3 * r['real_compute_p99']:.1f} ms over {r['messages']} messages; median step "
          f"{1e3 * r['median_step']:.0f} ms; job {took:.0f} s")


def ci(values: list[float], digits: int = 3) -> str:
    """mean [95% interval] over the finite values, with how many there were if some were not."""
    iv = interval(values)
    finite = sum(math.isfinite(v) for v in values)
    if digits == 3 or math.isnan(iv.mean):
        text = str(iv)
    elif math.isnan(iv.low):
        text = f"{iv.mean:.{digits}f}"
    else:
        text = f"{iv.mean:.{digits}f} [{iv.low:.{digits}f}, {iv.high:.{digits}f}]"
    return text + (f" ({finite}/{len(values)})" if finite < len(values) else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="data/fashion-mnist.h5")
    p.add_argument("--schemes", nargs="+", default=DEFAULT_SCHEMES, help="scheme or scheme:s (default: %(default)s)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16, help="per partition gradient")
    p.add_argument("--optimizer", default="benchmarks/recipe_factories.py:nesterov_wd")
    p.add_argument("--lr", type=float, default=0.1, help="the factory's lr (pgc-train records it; --min-lr is 0)")
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--clip-grad-norm", type=float, default=2.0)
    p.add_argument("--compute-time", type=float, default=0.1)
    p.add_argument("--delay", default="exp:0.1")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--target", type=float, default=0.86, help="test accuracy")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run (MPIEXEC_TIMEOUT)")
    p.add_argument("--out", default="bench/recipe-tta")
    p.add_argument("--reuse", action="store_true", help="keep runs already completed under --out")
    p.add_argument("--probe", type=int, metavar="STEPS", help="only one short dgd run: the real compute per gradient")
    p.add_argument("--plain-only", action="store_true", help="only the plain torch loop (for --steps)")
    p.add_argument("--no-plain", action="store_true", help="leave the plain loop out")
    p.add_argument("--plain-threads", type=int, default=2)
    p.add_argument("extra", nargs="*", help="more pgc-train flags, after --")
    a = p.parse_args()
    if a.probe:
        probe(a)
        return
    plain: dict[int, tuple[list[tuple[int, float]], float]] = {}
    if a.plain_only:
        for seed in a.seeds:
            began = time.monotonic()
            plain[seed] = plain_loop(a, seed, a.steps)
            curve, clipped = plain[seed]
            print(f"plain seed {seed} ({time.monotonic() - began:.0f} s, {clipped:.0%} of steps clipped): " +
                  " ".join(f"{k}:{acc:.4f}" for k, acc in curve), flush=True)
        return
    schemes = [parse_scheme(text) for text in a.schemes]
    results: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    began = time.monotonic()
    for i, seed in enumerate(a.seeds):
        order = schemes[i % len(schemes):] + schemes[:i % len(schemes)]  # rotate which scheme goes first
        for scheme, s in order:
            out = Path(a.out) / f"{scheme}-s{s}-seed{seed}"
            if not (a.reuse and run_completed(out)):
                took = run_one(a, scheme, s, seed, a.steps, out)
                print(f"{label(scheme, s)} seed {seed}: {took:.0f} s (total {time.monotonic() - began:.0f} s)",
                      flush=True)
            results.setdefault((scheme, s), {})[seed] = summarize(out, a.target, a.clip_grad_norm)
    if not a.no_plain:
        for seed in a.seeds:
            plain[seed] = plain_loop(a, seed, a.steps)
    report(a, schemes, results, plain)


def report(a: argparse.Namespace, schemes: list[tuple[str, int]], results: dict, plain: dict) -> None:
    seeds = a.seeds
    dgd = results.get(("dgd", 1), {})
    print(f"\n{a.workers} workers, cnn on {a.dataset}, batch {a.batch_size} per gradient, {a.steps} steps, "
          f"{a.optimizer} (lr {a.lr}), warm-up {a.warmup_steps} then cosine, clip {a.clip_grad_norm}, "
          f"--compute-time {a.compute_time}, --delay {a.delay}, evaluations every {a.eval_every} steps; "
          f"target test accuracy {a.target}; seeds {seeds}; mean [95% interval]; ratios to dgd paired by seed\n")
    print("| scheme | reached | time to target (s) | steps to target | median step (s) | time vs dgd | steps vs dgd "
          "| step vs dgd | final test acc | steps clipped | real compute per gradient, median / p99 (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for scheme, s in schemes:
        runs = results[(scheme, s)]

        def ratio(key: str, runs: dict = runs) -> str:
            return ci([runs[k][key] / dgd[k][key] if k in dgd and dgd[k][key] else math.nan for k in seeds])

        reached = sum(math.isfinite(runs[k]["time_to_target"]) for k in seeds)
        print(f"| {label(scheme, s)} | {reached}/{len(seeds)} | {ci([runs[k]['time_to_target'] for k in seeds])} "
              f"| {ci([runs[k]['steps_to_target'] for k in seeds])} | {ci([runs[k]['median_step'] for k in seeds])} "
              f"| {ratio('time_to_target')} | {ratio('steps_to_target')} | {ratio('median_step')} "
              f"| {ci([runs[k]['final_accuracy'] for k in seeds], 4)} "
              f"| {np.mean([runs[k]['clipped'] for k in seeds]):.0%} "
              f"| {1e3 * np.mean([runs[k]['real_compute_median'] for k in seeds]):.1f} / "
              f"{1e3 * max(runs[k]['real_compute_p99'] for k in seeds):.1f} |")
    if plain:
        curves = {k: plain[k][0] for k in seeds}
        print(f"| plain torch loop (batch {a.workers * a.batch_size}, {a.steps} steps) | "
              f"{sum(math.isfinite(first_at(curves[k], a.target)) for k in seeds)}/{len(seeds)} | - | "
              f"{ci([first_at(curves[k], a.target) for k in seeds])} | - | - | - | - | "
              f"{ci([curves[k][-1][1] for k in seeds], 4)} | {np.mean([plain[k][1] for k in seeds]):.0%} | - |")
    print("\nper seed: final test accuracy (steps to target)")
    for (scheme, s), runs in results.items():
        print(f"  {label(scheme, s)}: " + ", ".join(
            f"seed {k} {runs[k]['final_accuracy']:.4f} ({runs[k]['steps_to_target']:g})" for k in seeds))
    for k in seeds:
        if k in plain:
            curve = plain[k][0]
            print(f"  plain seed {k}: {curve[-1][1]:.4f} ({first_at(curve, a.target):g}); curve "
                  + " ".join(f"{step}:{acc:.3f}" for step, acc in curve))
    for k in seeds:
        if k in dgd:
            print(f"  dgd seed {k} curve: " + " ".join(f"{step}:{acc:.3f}" for step, acc in dgd[k]["curve"]))


if __name__ == "__main__":
    main()
