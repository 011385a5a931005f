"""`pgc-sim`: compare schemes side by side in the simulator, on the same straggler delays."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .config import CORE_FIELDS, MAX_SEED, SimConfig, add_core_options, show_default
from .errors import ConfigError, PgcError
from .problems import PROBLEMS
from .schemes import SCHEME_NAMES

if TYPE_CHECKING:  # pgc_mpi.sim imports torch (its optimizer): main() imports it once the flags are valid
    from .sim import SimResult

DEFAULT_SCHEMES = ("dgd", "is-sgd", "gc-fr", "gc-cr", "is-gc-fr", "is-gc-cr", "pgc-fr", "pgc-cr", "pbs")
# pgc-sim's own defaults for shared options: a cluster with exponential stragglers to compare schemes on
SIM_DEFAULTS = {"delay": "exp:1.0", "steps": 200}


def build_parser() -> argparse.ArgumentParser:
    """The pgc-sim argument parser: the options shared with pgc-train, then the simulator's own."""
    p = argparse.ArgumentParser(
        prog="pgc-sim",
        description="Simulate straggler schemes on one problem and the same seeded delays, and "
                    "print steps and simulated time to a target optimality gap. Times (--delay, "
                    "--deadline, --compute-time) are simulated seconds.",
    )
    add_core_options(p, SIM_DEFAULTS, skip=("scheme",))
    own = p.add_argument_group("simulator options")
    own.add_argument("--schemes", default=",".join(DEFAULT_SCHEMES),
                     help=f"comma-separated schemes, all: {','.join(SCHEME_NAMES)} (default: %(default)s)")
    own.add_argument("-n", "--workers", type=int, default=SimConfig.workers,
                     help=f"number of workers {show_default('workers', SimConfig.workers)}")
    own.add_argument("--problem", default="least-squares", choices=sorted(PROBLEMS),
                     help="synthetic problem (default: %(default)s)")
    own.add_argument("--samples", type=int, default=1200, help="training samples (default: %(default)s)")
    own.add_argument("--dim", type=int, default=20, help="parameters (default: %(default)s)")
    own.add_argument("--batch-size", type=int, default=None,
                     help="minibatch per partition (default: the whole partition)")
    own.add_argument("--compute-time", type=float, default=SimConfig.compute_time,
                     help="simulated seconds per partition gradient "
                          f"{show_default('compute_time', SimConfig.compute_time)}")
    own.add_argument("--target-gap", type=float, default=1e-3,
                     help="optimality gap F(w)-F* that counts as reached (default: %(default)s)")
    own.add_argument("--stop-at-target", action="store_true",
                     help="stop each run once the target gap is reached (default: off, run all --steps)")
    own.add_argument("--probe-every", type=int, default=SimConfig.probe_every,
                     help="steps between two probes of pbs's diagnostics (pgc-train: --eval-every) "
                          f"{show_default('probe_every', SimConfig.probe_every)}")
    own.add_argument("--seeds", type=int, default=1,
                     help="run every scheme with seeds SEED, SEED+1, ... (data, partitions and delays follow "
                          "the seed; the schemes of one seed see the same delays) and report mean±sd "
                          "(default: %(default)s)")
    own.add_argument("--out", type=Path, default=None,
                     help="write every run's per-step records as JSON lines to this file (default: none)")
    return p


def _per_seed(res: SimResult, target: float, dgd: SimResult | None) -> dict:
    """One simulated run's figures (a row of one seed)."""
    hit = res.first_below("gap", target)
    records = res.records
    gradients = sum(m[4] for r in records for m in r["messages"])  # MessageRecord.gradients
    return {
        "steps_to_target": hit["step"] + 1 if hit else None,
        "time_to_target": hit["wall_time"] if hit else None,
        "median_step_time": res.median_step_time(),
        "step_time_vs_dgd": res.median_step_time() / dgd.median_step_time() if dgd is not None else math.nan,
        "final_gap": records[-1].get("gap", math.nan) if records else math.nan,
        "max_staleness": max((r["max_staleness"] for r in records), default=0),
        "late_messages": sum(r["late"] for r in records),
        "stale_rejected": sum(r.get("stale_rejected", 0) for r in records),
        "gradients_per_step": gradients / len(records) if records else math.nan,
        "stalled": res.stalled,
    }


def summarize(results: dict[str, list[SimResult]], target: float) -> list[dict]:
    """One row per scheme over its seeds: means and standard deviations of the per-seed figures
    (times to target over the seeds that reached it, `reached` of `seeds`), worst staleness."""
    rows = []
    for name, runs in results.items():
        dgds = results.get("dgd", [None] * len(runs))
        seeds = [_per_seed(res, target, dgd) for res, dgd in zip(runs, dgds)]
        reached = sum(r["time_to_target"] is not None for r in seeds)
        row: dict = {"scheme": name, "seeds": len(seeds), "reached": reached,
                     "max_staleness": max(r["max_staleness"] for r in seeds),
                     "stalled": next((r["stalled"] for r in seeds if r["stalled"]), None)}
        for key in ("steps_to_target", "time_to_target", "median_step_time", "step_time_vs_dgd", "final_gap",
                    "late_messages", "stale_rejected", "gradients_per_step"):
            values = [r[key] for r in seeds if r[key] is not None]
            row[key] = float(np.mean(values)) if values else None
            row[key + "_sd"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        rows.append(row)
    return rows


def _spread(row: dict, key: str, fmt: str) -> str:
    """`mean ± sd` (or just the mean for one seed; `-` when no seed has a value)."""
    if row[key] is None or math.isnan(row[key]):
        return "-"
    text = format(row[key], fmt)
    return f"{text}±{format(row[key + '_sd'], fmt)}" if row["seeds"] > 1 else text


def format_table(rows: list[dict], target: float, fr_decode: str = "covered", header: str = "") -> str:
    """The comparison as an aligned text table, headed by what it depends on (target, rules, seeds)."""
    head = ["scheme", "reached", "steps to gap", "time to gap", "median step", "vs dgd", "final gap",
            "grads/step", "max stale", "rejected", "late"]
    lines = [head]
    for r in rows:
        lines.append([
            r["scheme"],
            f"{r['reached']}/{r['seeds']}",
            _spread(r, "steps_to_target", ".1f"),
            _spread(r, "time_to_target", ".1f"),
            _spread(r, "median_step_time", ".3f"),
            _spread(r, "step_time_vs_dgd", ".2f"),
            f"{r['final_gap']:.2e}",
            _spread(r, "gradients_per_step", ".2f"),
            str(r["max_staleness"]),
            f"{r['stale_rejected']:.0f}",
            f"{r['late_messages']:.0f}" + (" STALLED" if r["stalled"] else ""),
        ])
    widths = [max(len(row[k]) for row in lines) for k in range(len(head))]
    seeds = rows[0]["seeds"] if rows else 0
    out = [f"target gap {target:g}; times in simulated seconds; FR schemes decode: {fr_decode}; "
           f"{seeds} seed(s): mean±sd over seeds (times and steps over the seeds that reached the target), "
           f"rejected/late: mean per run{header}"]
    for row in lines:
        out.append("  ".join(cell.rjust(w) if k else cell.ljust(w) for k, (cell, w) in enumerate(zip(row, widths))))
    return "\n".join(out)


def configs_from_args(args: argparse.Namespace) -> dict[str, SimConfig]:
    """One validated SimConfig per scheme of --schemes for the first seed (ConfigError on the
    first bad one); the other seeds' configurations differ only in the seed."""
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    bad = [s for s in schemes if s not in SCHEME_NAMES]
    if bad:
        raise PgcError(f"unknown scheme(s) {bad}; choose from: {', '.join(SCHEME_NAMES)}")
    if args.seeds < 1 or args.seed + args.seeds - 1 > MAX_SEED:
        raise ConfigError(f"--seeds must be a positive integer with --seed + --seeds - 1 <= {MAX_SEED}, "
                          f"got {args.seeds}")
    if not (math.isfinite(args.target_gap) and args.target_gap >= 0):
        raise ConfigError(f"--target-gap must be a finite number >= 0, got {args.target_gap}")
    shared = {name: getattr(args, name) for name in CORE_FIELDS if name != "scheme"}
    return {
        name: SimConfig(**{**shared, "scheme": name, "c": args.c if name.startswith("is-gc") or name == "pbs" else None,
                           "replication": args.replication if name == "pbs" else None,
                           "adapt": args.adapt and name == "pbs"},
                        workers=args.workers, compute_time=args.compute_time, probe_every=args.probe_every,
                        target_gap=args.target_gap if args.stop_at_target else None)
        for name in schemes
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-sim`."""
    args = build_parser().parse_args(argv)
    try:
        configs = configs_from_args(args)
        from .sim import simulate  # torch: only once every configuration is known to be valid

        results: dict[str, list[SimResult]] = {name: [] for name in configs}
        for seed in range(args.seed, args.seed + args.seeds):
            problem = PROBLEMS[args.problem](args.workers, samples=args.samples, dim=args.dim,
                                             batch_size=args.batch_size, seed=seed)
            for name, cfg in configs.items():
                began = time.perf_counter()
                results[name].append(simulate(dataclasses.replace(cfg, seed=seed), problem))
                print(f"simulated {name} (seed {seed}): {len(results[name][-1].records)} steps in "
                      f"{time.perf_counter() - began:.2f} s", file=sys.stderr)
    except PgcError as exc:
        print(f"pgc-sim: error: {exc}", file=sys.stderr)
        return 2
    staleness = f"; --max-staleness {args.max_staleness}, --on-stale {args.on_stale}"
    print(format_table(summarize(results, args.target_gap), args.target_gap, args.fr_decode, staleness))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w") as fh:
            for name, runs in results.items():
                for res in runs:
                    for rec in res.records:
                        fh.write(json.dumps({"scheme": name, "seed": res.config.seed, **rec}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
