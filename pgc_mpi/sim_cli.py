"""`pgc-sim`: compare schemes side by side in the simulator, on the same straggler delays."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .config import CORE_FIELDS, SimConfig, add_core_options, show_default
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
    own.add_argument("--out", type=Path, default=None,
                     help="write every run's per-step records as JSON lines to this file (default: none)")
    return p


def summarize(results: dict[str, SimResult], target: float) -> list[dict]:
    """One row per scheme: steps and time to target, step time and its ratio to dgd's."""
    base = results["dgd"].median_step_time() if "dgd" in results else math.nan
    rows = []
    for name, res in results.items():
        hit = res.first_below("gap", target)
        last = res.records[-1] if res.records else {}
        rows.append({
            "scheme": name,
            "steps_run": len(res.records),
            "steps_to_target": hit["step"] + 1 if hit else None,
            "time_to_target": hit["wall_time"] if hit else None,
            "median_step_time": res.median_step_time(),
            "step_time_vs_dgd": res.median_step_time() / base,
            "final_gap": last.get("gap", math.nan),
            "max_staleness": max((r["max_staleness"] for r in res.records), default=0),
            "late_messages": sum(r["late"] for r in res.records),
            "stalled": res.stalled,
        })
    return rows


def format_table(rows: list[dict], target: float, fr_decode: str = "covered") -> str:
    """The comparison as an aligned text table, headed by what it depends on (target, FR rule)."""
    head = ["scheme", "steps to gap", "time to gap", "median step", "vs dgd", "final gap", "max stale", "late"]
    lines = [head]
    for r in rows:
        lines.append([
            r["scheme"],
            "-" if r["steps_to_target"] is None else str(r["steps_to_target"]),
            "-" if r["time_to_target"] is None else f"{r['time_to_target']:.1f}",
            f"{r['median_step_time']:.3f}",
            f"{r['step_time_vs_dgd']:.2f}",
            f"{r['final_gap']:.2e}",
            str(r["max_staleness"]),
            str(r["late_messages"]) + (" STALLED" if r["stalled"] else ""),
        ])
    widths = [max(len(row[k]) for row in lines) for k in range(len(head))]
    out = [f"target gap {target:g}; times in simulated seconds; FR schemes decode: {fr_decode}"]
    for row in lines:
        out.append("  ".join(cell.rjust(w) if k else cell.ljust(w) for k, (cell, w) in enumerate(zip(row, widths))))
    return "\n".join(out)


def configs_from_args(args: argparse.Namespace) -> dict[str, SimConfig]:
    """One validated SimConfig per scheme of --schemes (ConfigError on the first bad one)."""
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    bad = [s for s in schemes if s not in SCHEME_NAMES]
    if bad:
        raise PgcError(f"unknown scheme(s) {bad}; choose from: {', '.join(SCHEME_NAMES)}")
    if not (math.isfinite(args.target_gap) and args.target_gap >= 0):
        raise ConfigError(f"--target-gap must be a finite number >= 0, got {args.target_gap}")
    shared = {name: getattr(args, name) for name in CORE_FIELDS if name != "scheme"}
    return {
        name: SimConfig(**{**shared, "scheme": name, "c": args.c if name.startswith("is-gc") or name == "pbs" else None,
                           "replication": args.replication if name == "pbs" else None},
                        workers=args.workers, compute_time=args.compute_time,
                        target_gap=args.target_gap if args.stop_at_target else None)
        for name in schemes
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-sim`."""
    args = build_parser().parse_args(argv)
    try:
        configs = configs_from_args(args)
        from .sim import simulate  # torch: only once every configuration is known to be valid

        problem = PROBLEMS[args.problem](args.workers, samples=args.samples, dim=args.dim,
                                         batch_size=args.batch_size, seed=args.seed)
        results: dict[str, SimResult] = {}
        for name, cfg in configs.items():
            began = time.perf_counter()
            results[name] = simulate(cfg, problem)
            print(f"simulated {name}: {len(results[name].records)} steps in "
                  f"{time.perf_counter() - began:.2f} s", file=sys.stderr)
    except PgcError as exc:
        print(f"pgc-sim: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(summarize(results, args.target_gap), args.target_gap, args.fr_decode))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w") as fh:
            for name, res in results.items():
                for rec in res.records:
                    fh.write(json.dumps({"scheme": name, **rec}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
