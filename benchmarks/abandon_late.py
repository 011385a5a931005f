"""--abandon-late in the simulator: median step and time to target with and without, paired by seed.

    python benchmarks/abandon_late.py --seeds 5

For each delay model and candidate (scheme, s), every seed is simulated twice on the same
problem and delays: a straggler finishes its decided step (the newest-model rule: its message
is late and discarded), or abandons it at its next check point (--abandon-late: after a forward
pass or between micro-batches; `--accumulate` micro-batches per partition gradient). The table
gives, as means over the seeds, the mean step time (a bursty model's median is one of its two
modes) and the time and steps to the target loss of
both, their ratio (abandon / finish, paired by seed, with its 95% interval), and the fresh-start
floor: a Monte Carlo of the same order statistics in which every worker starts every step afresh
(a straggler drops its old step at once, at no cost to its buffers): the most that abandoning
could give. The finish column is itself the finish floor (the master takes no time here).

dgd, the all-reduce baseline, never abandons (it waits for every worker); its rows compare it
with DropCompute (--drop-compute, pgc_mpi.core.drop_compute) instead, at two thresholds of
`--thresholds`, named in the rows with the share of micro-batches computed: the one with the
shortest mean time to target over the same seeds (an oracle's choice), and the smallest one that
computes at least 90 % of the micro-batches (a batch close to the one asked for), and with the
threshold --drop-compute auto chooses (the most micro-batches per second over steps 1-20).
"""

from __future__ import annotations

import argparse

import numpy as np

from pgc_mpi.config import SimConfig
from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.core.stragglers import DelayModel
from pgc_mpi.learning.torch_problem import load_problem
from pgc_mpi.runs.stats import interval
from pgc_mpi.sim.simulator import simulate

CANDIDATES = ("dgd:0", "is-sgd:1", "is-sgd:2", "gc-cr:1", "pgc-fr:1", "pgc-fr:2", "pgc-cr:1", "pgc-cr:2")


def fresh_floor(scheme: str, s: int, n: int, delay: str, seed: int, compute: float, steps: int) -> float:
    """The mean step time if every worker started every step afresh: each step, worker i takes
    its gradients x compute + delay(i, t), and the step ends when the scheme can decode."""
    sch = make_scheme(scheme, n=n, s=s)
    gradients = len(sch.fresh_slots(1, 0))
    delays = DelayModel(delay, n, seed=seed)
    times = []
    for t in range(steps):
        done = np.array([gradients * compute + delays.delay(i, t) for i in range(n)])
        if scheme.endswith("-fr"):  # every group covered: the slowest group's fastest worker
            groups = {tuple(p) for p in sch.placement}
            times.append(max(done[[i for i in range(n) if tuple(sch.placement[i]) == g]].min() for g in groups))
        else:
            times.append(np.sort(done)[n - s - 1])
    return float(np.mean(times))


def run(args: argparse.Namespace, scheme: str, s: int, delay: str, seed: int, abandon: bool,
        drop_compute: float | str | None = None) -> tuple[float, ...]:
    """(mean step, time to target, steps to target, share of micro-batches computed) of one
    simulated run (nan: not reached)."""
    cfg = SimConfig(scheme=scheme, workers=args.workers, stragglers=s, steps=args.max_steps, lr=args.lr,
                    accumulate=args.accumulate, delay=delay, seed=seed,
                    compute_time=args.compute_time, eval_every=args.eval_every, target_loss=args.target_loss,
                    abandon_late=abandon, drop_compute=drop_compute, max_staleness=args.max_staleness)
    problem = load_problem(args.dataset, args.model, args.workers, args.batch_size, seed=seed)
    result = simulate(cfg, problem)
    hit = result.first_below(result.loss_key, args.target_loss)
    mean_step = float(np.mean([r["step_time"] for r in result.records]))
    share = float(np.mean([r.get("computed_share", 1.0) for r in result.records]))
    return (mean_step, hit["wall_time"] if hit else np.nan, hit["step"] + 1 if hit else np.nan, share)


def add_problem_options(p: argparse.ArgumentParser) -> None:
    """The cluster and problem both abandon benchmarks use (abandon_vs_mpi.py too)."""
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default="logreg")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--compute-time", type=float, default=0.05)
    p.add_argument("--max-staleness", default="window", help="--max-staleness of every run")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--candidates", default=",".join(CANDIDATES), help="scheme:s pairs")
    p.add_argument("--delays", default="exp:0.05,exp:0.1,markov:0.05:0.25:0.2")
    p.add_argument("--seeds", type=int, default=5)
    add_problem_options(p)
    p.add_argument("--target-loss", type=float, default=0.5)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--thresholds", default="0.02,0.03,0.04,0.05,0.06,0.075,0.1,0.125,0.15,0.2,0.3",
                   help="DropCompute thresholds (seconds) tried for dgd")
    args = p.parse_args()
    print(f"{args.workers} workers, {args.model} on {args.dataset}, {args.batch_size} x {args.accumulate} "
          f"micro-batches per partition gradient, compute {args.compute_time} s per gradient, target loss "
          f"{args.target_loss}, {args.seeds} seeds; means over seeds, ratios abandon/finish paired by seed "
          f"[95% interval]" + (f"; --max-staleness {args.max_staleness}" if args.max_staleness != "window" else ""))
    head = ("| delay | scheme | s | mean step: finish | abandon | ratio | fresh-start floor | abandon / floor "
            "| time to target: finish | abandon | ratio | steps: finish | abandon |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for delay in args.delays.split(","):
        for candidate in args.candidates.split(","):
            scheme, s = candidate.split(":")[0], int(candidate.split(":")[1])
            seeds = range(args.seeds)
            finish = np.array([run(args, scheme, s, delay, seed, False) for seed in seeds])
            if scheme != "dgd":
                abandon = np.array([run(args, scheme, s, delay, seed, True) for seed in seeds])
                print(_row(args, delay, scheme, s, seeds, finish, abandon), flush=True)
                continue
            # dgd: DropCompute at two of the thresholds instead of abandoning
            tried = {float(t): np.array([run(args, scheme, s, delay, seed, False, float(t)) for seed in seeds])
                     for t in args.thresholds.split(",")}
            fastest = min(tried, key=lambda t: np.mean(tried[t][:, 1]))
            near = min((t for t in tried if np.mean(tried[t][:, 3]) >= 0.9), default=max(tried))
            for t in dict.fromkeys((fastest, near)):
                label = f"dgd, DropCompute {t:g} s ({100 * np.mean(tried[t][:, 3]):.0f} % computed)"
                print(_row(args, delay, label, s, seeds, finish, tried[t]), flush=True)
            auto = np.array([run(args, scheme, s, delay, seed, False, "auto") for seed in seeds])
            label = f"dgd, DropCompute auto ({100 * np.mean(auto[:, 3]):.0f} % computed)"
            print(_row(args, delay, label, s, seeds, finish, auto), flush=True)


def _row(args: argparse.Namespace, delay: str, scheme: str, s: int, seeds: range, finish: np.ndarray,
         abandon: np.ndarray) -> str:
    floor = np.mean([fresh_floor(scheme.split(",")[0], s, args.workers, delay, seed, args.compute_time,
                                 args.max_steps) for seed in seeds])
    step_ratio = interval(abandon[:, 0] / finish[:, 0])
    time_ratio = interval(abandon[:, 1] / finish[:, 1])
    return (f"| {delay} | {scheme} | {s} | {finish[:, 0].mean():.4f} | {abandon[:, 0].mean():.4f} | "
            f"{step_ratio} | {floor:.4f} | {abandon[:, 0].mean() / floor:.2f} | {np.nanmean(finish[:, 1]):.2f} "
            f"| {np.nanmean(abandon[:, 1]):.2f} | {time_ratio} | {np.nanmean(finish[:, 2]):.1f} | "
            f"{np.nanmean(abandon[:, 2]):.1f} |")

if __name__ == "__main__":
    main()
