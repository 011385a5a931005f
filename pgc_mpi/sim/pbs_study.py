"""`python -m pgc_mpi.sim.pbs_study`: the bounded-staleness table (pbs) against dgd and gc-cr.

The design's own experiment, in the simulator, over paired seeds: n workers of heterogeneous
speed (some persistently slower), log-normal delays with occasional long stalls, pbs with
replication R and windows C, against dgd and gc-cr (s = 1), all on the same seeded problem and
delays within a seed. For each run: simulated time to a validation loss, validation accuracy at
an equal wall time (the shortest run of its seed), gradients received until the target, worker
utilization until then (gradient time over worker time), the oldest gradient used and, for pbs, the error
decomposition (pgc_mpi.learning.diagnostics). Then each pbs window against each baseline: paired wins
on time to target and the sign test's p-value (pgc_mpi.runs.stats).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config import SimConfig
from ..core.message import MessageRecord
from ..errors import PgcError
from ..learning.problems import Logistic
from ..runs.stats import mean_sd, sign_test

if TYPE_CHECKING:
    from .simulator import SimResult

# the design's delays scaled to a simulated gradient of 1 s: log-normal jitter (mean 0.5 s), a 2%
# chance per job of a 10-30 s stall, and 2 of the workers always 1 s slower (heterogeneous speeds)
DEFAULT_DELAY = "bimodal:0.5:0.02:10:30+persistent:2:1.0"


@dataclass(frozen=True)
class Run:
    """One scheme on one seed, reduced to the study's figures."""

    label: str
    seed: int
    time_to_target: float  # inf: never reached
    steps_to_target: int | None
    wall_time: float  # of the whole run
    records: list[dict]
    evals: list[dict]  # the validation metrics after every step (SimConfig's eval_every is 1)
    gradients: int  # received until the target (all of them when it was never reached)
    utilization: float
    max_age: int
    error_ratio: float  # mean error_bound / grad_norm_sq over pbs probes (nan for the others)
    stale_cosine: float

    def accuracy_at(self, when: float) -> float:
        """Validation accuracy after the last step finished by simulated time `when`."""
        done = [r for r in self.evals if r["wall_time"] <= when]
        return done[-1]["val_accuracy"] if done else math.nan


def configs(args: argparse.Namespace, seed: int) -> dict[str, SimConfig]:
    """The study's configurations for one seed, by label."""
    shared = dict(workers=args.workers, steps=args.steps, lr=args.lr, delay=args.delay, seed=seed,
                  compute_time=1.0, probe_every=args.probe_every)
    out = {"dgd": SimConfig(scheme="dgd", stragglers=0, **shared),
           "gc-cr": SimConfig(scheme="gc-cr", stragglers=1, **shared)}
    for c in args.windows:
        out[f"pbs R={args.replication} C={c}"] = SimConfig(scheme="pbs", replication=args.replication, c=c,
                                                           max_staleness="window", adapt=args.adapt, **shared)
    return out


def reduce(label: str, seed: int, res: SimResult, target: float, workers: int) -> Run:
    """A simulated run's records as the study's figures."""
    records = res.records
    hit = next((r for r in res.evals if r["val_loss"] <= target), None)
    until = records[: hit["step"] + 1] if hit else records
    gradients = sum(MessageRecord._make(m).gradients for r in until for m in r["messages"])
    busy = until[-1]["wall_time"] if until else math.nan
    probes = [r for r in records if "error_bound" in r and r["grad_norm_sq"] > 0]
    return Run(label, seed, hit["wall_time"] if hit else math.inf, hit["step"] + 1 if hit else None,
               records[-1]["wall_time"] if records else math.nan, records, res.evals,
               gradients, gradients * 1.0 / (workers * busy) if busy > 0 else math.nan,
               max((r["max_staleness"] for r in records), default=0),
               float(np.mean([r["error_bound"] / r["grad_norm_sq"] for r in probes])) if probes else math.nan,
               float(np.nanmean([r["stale_cosine"] for r in probes])) if probes else math.nan)


def study(args: argparse.Namespace) -> dict[str, list[Run]]:
    """Every configuration on every seed: {label: [run per seed]}."""
    from .simulator import simulate  # torch (the optimizer): imported once the arguments are known good

    runs: dict[str, list[Run]] = {}
    for seed in range(args.seed, args.seed + args.seeds):
        problem = Logistic(args.workers, samples=args.samples, dim=args.dim, batch_size=args.batch_size, seed=seed)
        for label, cfg in configs(args, seed).items():
            res = simulate(cfg, problem)
            if res.stalled:
                raise PgcError(f"{label}, seed {seed}: {res.stalled}")
            runs.setdefault(label, []).append(reduce(label, seed, res, args.target_val_loss, args.workers))
            print(f"seed {seed} {label}: {len(res.records)} steps", file=sys.stderr)
    return runs


def table(runs: dict[str, list[Run]], baselines: tuple[str, ...] = ("dgd", "gc-cr")) -> str:
    """The study's results as text: one row per configuration, then the paired comparisons."""
    seeds = len(next(iter(runs.values())))
    equal = [min(r[k].wall_time for r in runs.values()) for k in range(seeds)]  # per seed
    head = ["scheme", "reached", "time to target", "steps to target", "val acc at equal time",
            "gradients to target", "utilization", "max age", "bound/||g||^2", "stale cosine"]
    lines = [head]
    for label, rs in runs.items():
        reached = [r.time_to_target for r in rs if math.isfinite(r.time_to_target)]
        steps = [r.steps_to_target for r in rs if r.steps_to_target is not None]
        cells = [label, f"{len(reached)}/{len(rs)}", _fmt(mean_sd(reached), ".1f"), _fmt(mean_sd(steps), ".0f"),
                 _fmt(mean_sd([r.accuracy_at(t) for r, t in zip(rs, equal)]), ".4f"),
                 _fmt(mean_sd([r.gradients for r in rs]), ".0f"), _fmt(mean_sd([r.utilization for r in rs]), ".2f"),
                 str(max(r.max_age for r in rs)), _fmt(mean_sd([r.error_ratio for r in rs]), ".2g"),
                 _fmt(mean_sd([r.stale_cosine for r in rs]), ".4f")]
        lines.append(cells)
    widths = [max(len(row[k]) for row in lines) for k in range(len(head))]
    out = ["  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(row, widths)))
           for row in lines]
    out.append("")
    out.append("paired on time to target (win = reached sooner; never reaching it is a loss), exact sign test:")
    for label, rs in runs.items():
        if label in baselines:
            continue
        for base in baselines:
            if base in runs:
                result = sign_test([r.time_to_target for r in rs], [r.time_to_target for r in runs[base]])
                out.append(f"  {label} vs {base}: wins-losses {result}")
    return "\n".join(out)


def _fmt(stat: tuple[float, float], fmt: str) -> str:
    mean, sd = stat
    return "-" if math.isnan(mean) else f"{format(mean, fmt)}±{format(sd, fmt)}"


def build_parser() -> argparse.ArgumentParser:
    """The study's options (defaults: the runs recorded in docs/BENCHMARKS.md)."""
    p = argparse.ArgumentParser(prog="python -m pgc_mpi.sim.pbs_study", description=__doc__.split("\n\n")[1])
    p.add_argument("--seeds", type=int, default=8, help="paired seeds SEED, SEED+1, ... (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="first seed (default: %(default)s)")
    p.add_argument("--workers", type=int, default=8, help="simulated workers (default: %(default)s)")
    p.add_argument("--replication", type=int, default=2, help="pbs replication R (default: %(default)s)")
    p.add_argument("--windows", type=lambda t: [int(x) for x in t.split(",")], default=[2, 4, 8],
                   help="pbs windows C, comma-separated (default: 2,4,8)")
    p.add_argument("--adapt", action="store_true", help="pbs with --adapt (default: off)")
    p.add_argument("--probe-every", type=int, default=20,
                   help="steps between two diagnostics probes (default: %(default)s, as pgc-train's --eval-every)")
    p.add_argument("--delay", default=DEFAULT_DELAY, help="straggler model (default: %(default)s)")
    p.add_argument("--steps", type=int, default=600, help="steps per run (default: %(default)s)")
    p.add_argument("--lr", type=float, default=0.5, help="learning rate (default: %(default)s)")
    p.add_argument("--samples", type=int, default=4000, help="training samples (default: %(default)s)")
    p.add_argument("--dim", type=int, default=50, help="parameters (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, help="minibatch per gradient (default: %(default)s)")
    p.add_argument("--target-val-loss", type=float, default=0.16,
                   help="validation loss that counts as reached (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="also write the per-run figures as JSON lines")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the study and print its table."""
    args = build_parser().parse_args(argv)
    try:
        if args.seeds < 1 or any(c < 1 for c in args.windows):
            raise PgcError("--seeds and every --windows value must be positive integers")
        runs = study(args)
    except PgcError as exc:
        print(f"pbs_study: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.workers} workers, delay {args.delay}, logistic regression ({args.samples} samples, "
          f"{args.dim} parameters, batch {args.batch_size}), lr {args.lr}, {args.steps} steps, target "
          f"validation loss {args.target_val_loss}; mean±sd over {args.seeds} paired seeds; times in simulated "
          f"seconds (one gradient = 1 s)")
    print(table(runs))
    if args.out is not None:
        with args.out.open("w") as fh:
            for label, rs in runs.items():
                for r in rs:
                    fh.write(json.dumps({"scheme": label, "seed": r.seed, "time_to_target": r.time_to_target,
                                         "steps_to_target": r.steps_to_target, "wall_time": r.wall_time,
                                         "gradients": r.gradients, "utilization": r.utilization,
                                         "max_age": r.max_age, "error_ratio": r.error_ratio}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
