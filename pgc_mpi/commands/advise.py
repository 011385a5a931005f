"""`pgc-advise RUN --target-loss L`: which scheme and which s to train with on this cluster, from a
short probe run on it.

RUN is the folder of a short run on the cluster (a probe: e.g. 60 dgd steps of pgc-train or
pgc_mpi.fit, with the model and data to train). pgc-advise reads what it measured
(pgc_mpi.runs.probe: what each worker took beyond its computation, its computation per gradient,
the master's own time), simulates every candidate scheme and s on the probe's own problem with
those delays (pgc_mpi.sim.advice), to the target, on several seeds, and recommends the fastest
whose lead is outside the noise, else the simplest of the tie (pgc_mpi.sim.recommend). It prints
the measurements, a table and the recommendation with the commands that run it; --json prints
the same as JSON; --out DIR writes advice.md, advice.csv, advice.png (with matplotlib) and the
replayed traces. Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..core.schemes import SCHEME_NAMES
from ..errors import PgcError
from ..runs.delays import WARMUP
from ..runs.probe import Probe, read_probe
from ..sim.recommend import MARGIN
from . import advise_report as report

PROG = "pgc-advise"
DEFAULT_SEEDS = 3
SEED_BUDGET = 4  # --max-seeds by default: this many times --seeds
DEFAULT_MAX_STEPS = 500
EVAL_EVERY = {True: 1, False: 5}  # synthetic problem, torch problem: whole-data evaluations cost more there


class AdviseError(PgcError):
    """Input pgc-advise cannot advise from (its message is the one line it prints)."""


def parser() -> argparse.ArgumentParser:
    """pgc-advise's command line."""
    p = argparse.ArgumentParser(
        prog=PROG, description="Recommend a scheme and s for this cluster from a short probe run on it: every "
                               "candidate is simulated on the probe's own problem with the delays it measured.")
    p.add_argument("run", type=Path, metavar="RUN", help="the probe's run folder (pgc-train's or pgc_mpi.fit's --out)")
    target = p.add_argument_group("target (one is required)")
    target.add_argument("--target-loss", type=float, default=None,
                        help="the evaluated training loss to reach (the test loss if the probe ran with "
                             "--no-eval-train)")
    target.add_argument("--target-accuracy", type=float, default=None,
                        help="the evaluated accuracy to reach, in [0, 1] (test accuracy; a synthetic logistic "
                             "problem's validation accuracy)")
    p.add_argument("--schemes", default=",".join(SCHEME_NAMES),
                   help="comma-separated candidate schemes (default: every simulated one, %(default)s; ddp is "
                        "not simulated)")
    p.add_argument("--s", default="1,2,3", help="comma-separated s values to try, those valid for the run's "
                                                "workers and each scheme (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help="seeds per candidate to start with: the probe's seed and the next ones (default: "
                        "%(default)s)")
    p.add_argument("--max-seeds", type=int, default=None,
                   help="while the leader is not separated from another candidate (their paired time ratio's "
                        "interval holds 1 but its mean is not within 5%% of 1, or the leader changes), the "
                        "contenders run on twice as many seeds, up to this many (default: "
                        f"{SEED_BUDGET} x --seeds)")
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS,
                   help="simulated steps at most per run (default: %(default)s)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="evaluate every this many simulated steps: times to target are resolved to it (default: "
                        f"{EVAL_EVERY[True]} for a synthetic problem, {EVAL_EVERY[False]} for a torch model)")
    p.add_argument("--delay-model", choices=("trace", "fit"), default="trace",
                   help="trace: replay the measured extras; fit: draw from the --delay spec fitted to them "
                        "(default: %(default)s)")
    p.add_argument("--master-cost", default="probe", metavar="probe|none|FILE",
                   help="the simulated master's own cost: probe, its median times measured by the probe; none; or "
                        "a cost model file (benchmarks/master_cost.py --fit) (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=WARMUP,
                   help="leave out the probe's first this many steps (default: %(default)s)")
    yours = p.add_argument_group("a pgc_mpi.fit probe's model, data, loss and recipe, as pgc-train's PATH:NAME "
                                 "plug-ins")
    for name in ("model", "dataset", "loss", "optimizer", "scheduler"):
        yours.add_argument(f"--{name}", default=None, metavar="PATH:NAME",
                           help=f"the {name} to simulate instead of the probe's (required for a fit run's Python "
                                f"object)")
    p.add_argument("--options", action=argparse.BooleanOptionalAction, default=True,
                   help="also simulate the options that change the answer as candidates of their own: "
                        "--drop-compute auto for dgd (with the probe's --accumulate of 2 or more) and --abandon-late "
                        "for the schemes that may abandon a decided step (default: on; --no-options: the schemes "
                        "as the probe ran)")
    p.add_argument("--json", action="store_true", help="print the advice as JSON instead of text")
    p.add_argument("--out", type=Path, default=None,
                   help="write advice.md, advice.csv, advice.png and the replayed traces into this folder")
    return p


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise AdviseError(f"{what} {text!r}: give comma-separated whole numbers, e.g. 1,2,3") from None
    if not values or min(values) < 0:
        raise AdviseError(f"{what} {text!r}: give comma-separated whole numbers >= 0, e.g. 1,2,3")
    return values


def _reached(probe: Probe) -> str:
    """What the probe's last evaluation reached, in words (for the messages about targets)."""
    from ..sim.advice import Target

    e = probe.last_eval
    loss, accuracy = Target("loss", 0).key(e), Target("accuracy", 0).key(e)
    parts = [f"{key} {e[key]:.4g}" for key in (loss, accuracy) if key is not None and e[key] is not None]
    if not parts:
        return "the probe has no evaluation"
    return f"the probe reached {' and '.join(parts)} at step {e.get('step')}"


def target_of(args: argparse.Namespace, probe: Probe):
    """The target the flags give (AdviseError: none, both, or one the probe's evaluations lack)."""
    from ..sim.advice import Target

    if (args.target_loss is None) == (args.target_accuracy is None):
        raise AdviseError(f"give one target, --target-loss L or --target-accuracy A ({_reached(probe)})")
    target = Target("loss", args.target_loss) if args.target_accuracy is None else \
        Target("accuracy", args.target_accuracy)
    if not math.isfinite(target.value) or target.kind == "accuracy" and not 0 <= target.value <= 1:
        within = " in [0, 1]" if target.kind == "accuracy" else ""
        raise AdviseError(f"--target-{target.kind} must be a finite number{within}, got {target.value}")
    if probe.last_eval and target.key(probe.last_eval) is None:
        raise AdviseError(f"--target-{target.kind}: the probe's evaluations report no {target.kind} "
                          f"({', '.join(k for k in probe.last_eval if k not in ('event', 'step', 'time'))}); "
                          f"use --target-loss")
    return target


def advise(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The advice as --json prints it (traces and the master's cost model written into `folder`)."""
    from ..sim import advice

    probe = read_probe(args.run, args.warmup)
    target = target_of(args, probe)
    max_seeds, schemes = _budget_and_schemes(args)
    problem = advice.problem_choice(probe, args.model, args.dataset, args.loss)
    cost = {"probe": lambda: advice.master_cost(probe, folder), "none": lambda: None}.get(
        args.master_cost, lambda: args.master_cost)()
    if cost is not None:
        from ..sim.master_cost import load

        load(cost)  # a bad file: one line now, not after the first simulation
    eval_every = args.eval_every or EVAL_EVERY[probe.synthetic is not None]
    base = advice.base_options(probe, args.max_steps, eval_every, max(probe.compute_time(), 1e-9), cost, target,
                               args.optimizer, args.scheduler)
    planned, skipped = advice.plan(schemes, _ints(args.s, "--s"), base, args.options)
    if not planned:
        raise AdviseError(f"no candidate runs on {probe.workers} workers: {'; '.join(skipped)}")
    delays, results, chosen, rounds = adaptive(probe, args, folder, planned, problem, target, max_seeds)
    if chosen is None:
        raise _not_reached(probe, target, results, args.max_steps)
    results.sort(key=lambda r: (not r.counted, r.time.mean if r.counted else math.inf))
    d = probe.delays
    seeds = max(r.seeds for r in results)
    return {
        "recommended": {"scheme": chosen.choice.scheme, "s": chosen.choice.s, "flags": list(chosen.choice.flags),
                        "clear": chosen.clear,
                        "tie": [{"scheme": r.scheme, "s": r.s, "flags": list(r.flags)} for r in chosen.tie],
                        "why": chosen.describe(),
                        "settled": chosen.settled, "margin": MARGIN,
                        "unsure": [{"scheme": r.scheme, "s": r.s, "flags": list(r.flags)} for r in chosen.unsure],
                        "seed_rounds": rounds,
                        "note": report.seeds_note(chosen, rounds, max_seeds, probe.steps_measured),
                        "commands": report.train_commands(probe, chosen.choice)},
        "candidates": [report.row_of(r, chosen) for r in results],
        "delays": {"messages": d.overall.count, "steps": probe.steps_measured, "warmup": d.warmup,
                   "mean": d.overall.mean, "median": d.overall.median, "p90": d.overall.p90, "p99": d.overall.p99,
                   "max": d.max, "tail_p99_over_mean": report._number(d.tail), "lag1": report._number(d.lag1),
                   "correlated": d.correlated, "slow_workers": {str(w): sec for w, sec in d.slow.items()},
                   "per_worker_median": {str(w.worker): w.spread.median for w in d.workers},
                   "fitted": d.fit.spec, "replayed": delays.note},
        "used": delays.used,
        "compute_time": base["compute_time"], "compute_per_worker": {str(w): c for w, c in probe.compute.items()},
        "master_cost": cost, "master_parts": probe.master,
        "target": {"kind": target.kind, "value": target.value}, "seeds": seeds, "start_seeds": args.seeds,
        "max_seeds": max_seeds, "max_steps": args.max_steps,
        "eval_every": eval_every, "skipped": skipped,
        "probe": {"run": str(probe.path), "scheme": probe.scheme, "workers": probe.workers, "program": probe.program,
                  "problem": problem.describe(), "reached": _reached(probe), "text": probe.describe()},
    }


def _budget_and_schemes(args: argparse.Namespace) -> tuple[int, list[str]]:
    """(the seed budget, the candidate schemes) of the command line, checked (AdviseError)."""
    max_seeds = SEED_BUDGET * args.seeds if args.max_seeds is None else args.max_seeds
    for value, what in ((args.seeds, "--seeds"), (args.max_steps, "--max-steps"), (max_seeds, "--max-seeds")):
        if value < 1:
            raise AdviseError(f"{what} must be a positive integer, got {value}")
    if max_seeds < args.seeds:
        raise AdviseError(f"--max-seeds {max_seeds} is below --seeds {args.seeds}: give at least as many")
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    unknown = [s for s in schemes if s not in SCHEME_NAMES]
    if unknown or not schemes:
        raise AdviseError(f"--schemes: {', '.join(unknown) or 'none given'}: choose among {', '.join(SCHEME_NAMES)} "
                          f"(ddp is not simulated; dgd stands for it: it waits for every worker too)")
    return max_seeds, schemes


def _not_reached(probe: Probe, target, results: list, max_steps: int) -> AdviseError:
    """The error when no candidate reached the target on every seed: what the probe reached, and what to do."""
    partly = ", ".join(r.name for r in results if r.reached)
    key = target.key(probe.last_eval) if probe.last_eval else None
    example = (f"the {target.kind} it reached ({probe.last_eval[key]:.4g} at step {probe.last_eval.get('step')})"
               if key is not None else "one its evaluations show")
    return AdviseError(f"target {target.describe()} not reached by any candidate "
                       f"{'on every seed ' if partly else ''}in {max_steps} simulated steps"
                       f"{f' (only on some seeds: {partly})' if partly else ''}: choose a target the probe's model "
                       f"can reach, e.g. {example}, or raise --max-steps")


def adaptive(probe: Probe, args: argparse.Namespace, folder: Path, planned: dict, problem, target, max_seeds: int):
    """Every candidate on --seeds seeds, then, while the recommendation is not settled (a candidate
    unsure against the fastest) or the fastest changed, the contenders (the fastest, the tied and
    the unsure: pgc_mpi.sim.recommend.contenders) on twice as many, up to `max_seeds`. Returns
    the Replay, the candidates' results, the Recommendation (None: no candidate reached the target
    on every seed) and the seed counts of the rounds."""
    from ..sim import advice
    from ..sim.recommend import contenders, recommend

    total = args.seeds
    delays = advice.replay(probe, args.delay_model, args.max_steps, total, folder)
    runs = advice.simulate_seeds(planned, problem, 0, total, delays)
    results = [advice.summarize(c, runs[c], target) for c in planned]
    chosen, rounds, leader = recommend(results), [total], None
    while chosen is not None and total < max_seeds and (not chosen.settled
                                                         or leader not in (None, chosen.fastest.name)):
        leader, more = chosen.fastest.name, {r.name for r in contenders(chosen)}
        total = min(2 * total, max_seeds)
        delays = advice.replay(probe, args.delay_model, args.max_steps, total, folder)
        for c in planned:
            if c.name in more and len(runs[c]) < total:
                runs[c] += advice.simulate_seeds({c: planned[c]}, problem, len(runs[c]), total, delays)[c]
        results = [advice.summarize(c, runs[c], target) for c in planned]
        chosen = recommend(results)
        rounds.append(total)
    return delays, results, chosen, rounds


def text(result: dict[str, Any]) -> str:
    """The advice as pgc-advise prints it."""
    p, rec = result["probe"], result["recommended"]
    lines = [p["text"], "", f"simulated: every candidate on {p['problem']} with {p['workers']} workers, "
             f"{_seeds(result)}, up to {result['max_steps']} steps, evaluated every {result['eval_every']}; "
             f"compute {result['compute_time']:.4g} s per gradient; delays: {result['used']}, "
             f"{result['delays']['replayed']}; master cost: {result['master_cost'] or 'none'}",
             f"target {result['target']['kind']} {result['target']['value']:g}; time to target: mean [95% interval, "
             f"Student t] over the seeds that reached it, in simulated seconds; vs recommended: its time over "
             f"the recommendation's, paired by seed, mean [95% interval]", "",
             report.table(result["candidates"]), "", rec["why"], *(f"  {c}" for c in rec["commands"])]
    if rec["note"]:
        lines += ["", rec["note"]]
    if result["skipped"]:
        lines += ["", "left out:", *(f"  {s}" for s in result["skipped"])]
    return "\n".join(lines)


def _seeds(result: dict[str, Any]) -> str:
    rounds = result["recommended"]["seed_rounds"]
    more = f" (the contenders; {' then '.join(map(str, rounds))})" if len(rounds) > 1 else ""
    return f"{result['seeds']} seed(s){more} of at most {result['max_seeds']}"


def write_out(result: dict[str, Any], out: Path) -> list[str]:
    """advice.md, advice.csv and (with matplotlib) advice.png in `out`; returns notes for stderr."""
    from .plot import PLOT_EXTRA, have_matplotlib

    (out / "advice.md").write_text(f"# pgc-advise {result['probe']['run']}\n\n```\n{result['probe']['text']}\n```\n\n"
                                   f"{report.markdown_table(result['candidates'])}\n\n{result['recommended']['why']}\n\n"
                                   + (f"{result['recommended']['note']}\n\n" if result['recommended']['note'] else "")
                                   + "".join(f"    {c}\n" for c in result["recommended"]["commands"]))
    report.write_csv(result["candidates"], out / "advice.csv")
    if not have_matplotlib():
        return [f"{PROG}: no figure: it needs matplotlib: {PLOT_EXTRA}"]
    target = result["target"]
    report.figure(result["candidates"], out / "advice.png",
                  f"{result['probe']['problem']}, {result['probe']['workers']} workers: time to "
                  f"{target['kind']} {target['value']:g} ({result['used']} delays)")
    return []


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-advise`: 0 with advice, 2 (one line on stderr) on bad input."""
    args = parser().parse_args(argv)
    try:
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            result = advise(args, args.out)
            notes = write_out(result, args.out)
        else:
            with tempfile.TemporaryDirectory(prefix="pgc-advise-") as folder:
                result = advise(args, Path(folder))
            if args.master_cost == "probe" and result["master_cost"]:  # the file went with the temporary folder
                result["master_cost"] = "the probe's measured times"
            notes = []
    except (PgcError, OSError) as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else text(result))
    for note in notes:
        print(note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
