"""pgc-advise against MPI: the advice from a short dgd probe, checked against measured MPI runs.

    python benchmarks/advise_vs_mpi.py --out /tmp/advise-vs-mpi

For each delay situation (none; exponential of mean 1x the compute; one persistently slow
worker; bursty two-state delays; heavy tails: Pareto (Lomax, shape 1.3: infinite variance) with one
slow node, log-normal of sigma 1.5; and exponential delays under a user's optimizer and schedule
given as plug-ins, benchmarks/advise_factories.py) it runs a 60-step dgd probe under mpiexec on `--workers`
workers (each partition gradient emulated to take `--compute-time` seconds, so that the ranks
sharing this machine's cores behave like cluster nodes, and the situation's `--delay` injected),
asks `pgc-advise --json` for its prediction of every candidate's time to the target loss, then
runs candidates under mpiexec on `--seeds` seeds (stopping at the target) and measures their
time to target (wall time, evaluations left out): every candidate predicted within `--within`
(1.5) times the recommendation's time, and each scheme's fastest predicted candidate besides
(`--within 0`: every candidate; with the option candidates a situation has 25 of them, about 25
minutes of runs on this machine). It prints, per situation, the predicted and
measured times with their 95% intervals and their ratio, each candidate's measured time over
the measured fastest's paired by seed, and whether the recommended candidate is the measured
fastest or within its noise (the 95% interval of the per-seed differences between the two
contains 0). Candidates with options (`--abandon-late`, `--max-staleness none`, ...) run with
those flags. Runs already finished in `--out` are reused, so an interrupted
benchmark resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from pgc_mpi.runs.results import run_completed, summarize_run
from pgc_mpi.runs.stats import Interval, interval, paired_ratio

FACTORIES = Path(__file__).resolve().parent / "advise_factories.py"
RECIPE = ("--optimizer", f"{FACTORIES}:momentum_sgd", "--scheduler", f"{FACTORIES}:step_decay")
# name: (--delay, the flags every run of the situation adds, the probe's among them)
SITUATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "none": ("none", ()), "exp": ("exp:0.05", ()), "slow": ("fixed:3:0.15", ()),
    "bursty": ("markov:0.05:0.25:0.2", ()), "pareto": ("pareto:0.03:1.3+persistent:1:0.15", ()),
    "lognormal": ("lognormal:0.05:1.5", ()), "recipe": ("exp:0.05", RECIPE)}


def train(args: argparse.Namespace, out: Path, delay: str, scheme: str, s: int, seed: int, steps: int,
          target: float | None, flags: tuple[str, ...] = ()) -> Path:
    """One pgc-train run under mpiexec into `out` (reused when it has finished)."""
    if run_completed(out):
        return out
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(args.workers + 1), sys.executable, "-m",
           "pgc_mpi", "train", "--scheme", scheme, "-s", str(s), "--dataset", args.dataset, "--model", args.model,
           "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--steps", str(steps),
           "--eval-every", str(args.eval_every), "--delay", delay, "--compute-time", str(args.compute_time),
           "--seed", str(seed), "--out", str(out), "--overwrite", *flags]
    if target is not None:
        cmd += ["--target-loss", str(target)]
    env = {**os.environ, "MPIEXEC_TIMEOUT": "600", "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=660)
    return out


def advise(args: argparse.Namespace, probe: Path, out: Path) -> dict:
    """pgc-advise's --json answer for the probe."""
    cmd = [str(Path(sys.executable).parent / "pgc-advise"), str(probe), "--target-loss", str(args.target_loss),
           "--schemes", args.schemes, "--s", args.s, "--seeds", str(len(args.seeds)), "--eval-every",
           str(args.eval_every), "--max-steps", str(args.max_steps), "--json", "--out", str(out)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800)
    return json.loads(done.stdout)


Key = tuple[str, int | None, str]  # scheme, s, the candidate's option flags


def _key(candidate: dict) -> Key:
    """A pgc-advise --json candidate's key."""
    return candidate["scheme"], candidate["s"], candidate.get("flags", "")


def _name(key: Key) -> str:
    return " ".join(x for x in (key[0], "" if key[1] is None else f"s={key[1]}", key[2]) if x)


def _fmt(i: Interval) -> str:
    return "-" if i.k == 0 else (f"{i.mean:.2f}" if i.k < 2 else f"{i.mean:.2f} [{i.low:.2f}, {i.high:.2f}]")


def chosen_to_run(candidates: list[dict], within: float) -> list[dict]:
    """The candidates predicted within `within` times the recommendation's time (0: all), and each
    scheme's fastest predicted one."""
    if within <= 0:
        return candidates
    best = min(c["time_to_target"] for c in candidates if c["recommended"])
    ordered = sorted((c for c in candidates if c["time_to_target"] is not None), key=lambda c: c["time_to_target"])
    leaders = {c["scheme"]: c for c in reversed(ordered)}  # each scheme's fastest
    return [c for c in ordered if c["time_to_target"] <= within * best or leaders[c["scheme"]] is c]


def measure(args: argparse.Namespace, folder: Path, delay: str, extra: tuple[str, ...],
            candidates: list[dict]) -> dict[Key, list[float]]:
    """The candidates under mpiexec on every seed: their times to target (nan: not reached)."""
    measured: dict[Key, list[float]] = {}
    for c in candidates:
        key = _key(c)
        slug = "".join(f"-{f.lstrip('-')}" for f in key[2].split())
        times = []
        for seed in args.seeds:
            run = train(args, folder / f"{c['scheme']}-s{c['s'] or 1}{slug}-seed{seed}", delay, c["scheme"],
                        c["s"] or 1, seed, args.max_steps, args.target_loss, (*extra, *key[2].split()))
            took = summarize_run(run, args.target_loss).time_to_target
            times.append(math.nan if took is None else took)
            print(f"{folder.name}: {_name(key)} seed {seed}: {times[-1]}", file=sys.stderr)
        measured[key] = times
    return measured


def situation(args: argparse.Namespace, name: str, delay: str, extra: tuple[str, ...]) -> list[str]:
    """The table rows (markdown) of one delay situation; progress on stderr."""
    folder = args.out / name
    suffix = "" if args.probe_steps == 60 else f"-{args.probe_steps}"  # the candidates' runs are shared
    probe = train(args, folder / f"probe{suffix}", delay, "dgd", 1, args.seeds[0], args.probe_steps, None, extra)
    answer = advise(args, probe, folder / f"advice{suffix}")
    measured = measure(args, folder, delay, extra, chosen_to_run(answer["candidates"], args.within))
    reached = {k: v for k, v in measured.items() if all(math.isfinite(t) for t in v)}
    fastest = min(reached, key=lambda k: sum(reached[k]))
    chosen = next(_key(c) for c in answer["candidates"] if c["recommended"])
    diff = interval([a - b for a, b in zip(reached[chosen], reached[fastest])]) if chosen in reached else None
    if chosen == fastest:
        verdict = "the measured fastest"
    elif diff is not None and not diff.excludes(0.0):
        verdict = f"within the measured fastest's noise ({_name(fastest)}: difference {_fmt(diff)} s)"
    else:
        verdict = f"NOT the measured fastest ({_name(fastest)}; difference {diff and _fmt(diff)} s)"
    if chosen != fastest:
        verdict += f"; measured {_fmt(paired_ratio(measured[chosen], measured[fastest]))} x the fastest's time"
    flags = f" `{' '.join(extra)}`".replace(str(FACTORIES.parent), "benchmarks") if extra else ""
    rows = [f"\n**{name}** (`--delay {delay}`{flags}, a {args.probe_steps}-step probe): recommended "
            f"{_name(chosen)}: {verdict}\n",
            "| candidate | predicted (s) | measured (s) | predicted / measured | measured / fastest | advice |",
            "|---|---|---|---|---|---|"]
    for c in sorted(answer["candidates"], key=lambda c: c["time_to_target"] or float("inf")):
        key = _key(c)
        m = interval(measured.get(key, []))
        predicted = Interval(c["time_to_target"], c["time_low"], c["time_high"], c["reached"]) \
            if c["time_to_target"] is not None else Interval(float("nan"), float("nan"), float("nan"), 0)
        ratio = f"{predicted.mean / m.mean:.3f}" if predicted.k and m.k else "-"
        mark = "recommended" if c["recommended"] else "tie" if c["tie"] else \
            "unsure" if c.get("verdict") == "unsure" else ""
        mark = (mark + " (measured fastest)").strip() if key == fastest else mark
        against = _fmt(paired_ratio(measured[key], measured[fastest])) if key in measured else "not run"
        rows.append(f"| {_name(key)} | {_fmt(predicted)} | {_fmt(m)} | {ratio} | {against} | {mark} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the runs and advice (reused runs resume)")
    p.add_argument("--situations", default=",".join(SITUATIONS), help=f"a subset of {','.join(SITUATIONS)}")
    p.add_argument("--schemes", default="dgd,is-sgd,gc-cr,pgc-fr,pgc-cr")
    p.add_argument("--s", default="1,2")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default="logreg")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--compute-time", type=float, default=0.05)
    p.add_argument("--target-loss", type=float, default=0.5)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--probe-steps", type=int, default=60)
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--within", type=float, default=1.5,
                   help="run the candidates predicted within this factor of the recommendation (0: all)")
    args = p.parse_args()
    unknown = set(args.situations.split(",")) - set(SITUATIONS)
    if unknown:
        p.error(f"--situations: unknown {sorted(unknown)}; choose from {','.join(SITUATIONS)}")
    print(f"pgc-advise against MPI: {args.workers} workers, {args.model} on {args.dataset}, compute "
          f"{args.compute_time} s per gradient, target loss {args.target_loss}, seeds {args.seeds}; times to "
          f"target: mean [95% interval] over the seeds")
    for name in args.situations.split(","):
        print("\n".join(situation(args, name, *SITUATIONS[name])), flush=True)


if __name__ == "__main__":
    main()
