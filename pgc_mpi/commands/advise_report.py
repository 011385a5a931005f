"""pgc-advise's answer in its forms: the candidates as rows (one dict each, what --json prints and
what the text table, advice.md and advice.csv are formatted from, so that they always agree), the
commands that run the recommendation, and the figure."""

from __future__ import annotations

import csv
import math
import shlex
from pathlib import Path
from typing import Any

from ..config.options import build_parser
from ..runs.probe import Probe
from ..sim.advice import option_marks
from ..sim.recommend import MARGIN, CandidateResult, Recommendation

# The probe's flags that the recommendation replaces (the scheme's own ones among them), that
# belong to the probe's folder (--out, --resume, --overwrite) and length (--steps: the real run's),
# or that the launchers set themselves (--threads: launch/local.sh and train.sbatch pass
# OMP_NUM_THREADS; the probe's, repeated after it, would override the cluster's)
REPLACED = ("--scheme", "--stragglers", "--c", "--replication", "--adapt", "--out", "--resume", "--overwrite",
            "--resume-other-data", "--steps", "--threads")
COLUMNS = ("scheme", "s", "reached", "time to target (s)", "steps to target", "time/step (s)", "final loss",
           "final acc", "vs recommended", "")


def _number(value: float) -> float | None:
    """A figure as JSON has it: None for nan."""
    return None if value is None or math.isnan(value) else float(value)


def row_of(r: CandidateResult, advice: Recommendation | None) -> dict[str, Any]:
    """One candidate as a JSON-able row (times in simulated seconds; None: not reached, or no value).
    `times`: per seed (None: not reached); `ratio`, `ratio_low`, `ratio_high`: its time over the
    recommendation's, paired by seed, mean and 95% interval; `verdict`: against the fastest
    (pgc_mpi.sim.recommend.VERDICTS)."""
    chosen = advice is not None and advice.choice == r
    ratio = r.ratio_to(advice.choice) if advice is not None else None
    comparison = advice.comparisons.get(r.name) if advice is not None else None
    return {"scheme": r.scheme, "s": r.s, "flags": " ".join(r.flags), "seeds": r.seeds, "reached": r.reached,
            "time_to_target": _number(r.time.mean), "time_low": _number(r.time.low),
            "time_high": _number(r.time.high), "steps_to_target": _number(r.steps.mean),
            "step_time": _number(r.step_time.mean), "final_loss": _number(r.final_loss),
            "final_accuracy": _number(r.final_accuracy), "recommended": chosen,
            "tie": advice is not None and r in advice.tie,
            "ratio": _number(ratio.mean) if ratio else None, "ratio_low": _number(ratio.low) if ratio else None,
            "ratio_high": _number(ratio.high) if ratio else None,
            "verdict": comparison.verdict if comparison else None,
            "times": [None if math.isinf(t) else t for t in r.times]}


def seeds_note(advice: Recommendation, rounds: list[int], max_seeds: int, probe_steps: int) -> str:
    """What more seeds did, and, when the advice is not sure, what would settle it ("" when the
    first seeds settled it)."""
    if advice.settled and len(rounds) == 1:
        return ""
    fastest = advice.fastest or advice.choice
    grown = (f"seeds: {' -> '.join(map(str, rounds))} for the contenders (the fastest, the tied and the unsure), "
             f"to separate the leader")
    if advice.settled:
        return f"{grown}: settled."
    names = ", ".join(r.name for r in advice.unsure)
    return (f"{grown}: NOT SURE after {rounds[-1]} seeds (--max-seeds {max_seeds}): {names} against {fastest.name} "
            f"is neither a tie (paired ratio within ±{MARGIN:.0%} of 1) nor separated. More seeds (--max-seeds "
            f"{2 * max_seeds}) would narrow the paired interval; a longer probe (it measured {probe_steps} steps) "
            f"would replay more of the cluster's delays, its rare long ones included, in every seed.")


def _g(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def cells(row: dict[str, Any]) -> list[str]:
    """A row's cells in the table's columns."""
    time = _g(row["time_to_target"])
    if row["time_low"] is not None:
        time += f" [{_g(row['time_low'])}, {_g(row['time_high'])}]"
    mark = "<- recommended" if row["recommended"] else "tie" if row["tie"] else \
        "unsure" if row.get("verdict") == "unsure" else ""
    mark = "; ".join(m for m in (mark, *option_marks(tuple(row.get("flags", "").split()))) if m)
    ratio = _g(row.get("ratio"), 3)
    if row.get("ratio_low") is not None:
        ratio += f" [{_g(row['ratio_low'], 3)}, {_g(row['ratio_high'], 3)}]"
    scheme = " ".join([row["scheme"], *([row["flags"]] if row.get("flags") else [])])
    return [scheme, "-" if row["s"] is None else str(row["s"]), f"{row['reached']}/{row['seeds']}", time,
            _g(row["steps_to_target"]), _g(row["step_time"]), _g(row["final_loss"]), _g(row["final_accuracy"]),
            ratio, mark]


def table(rows: list[dict[str, Any]]) -> str:
    """The candidates as an aligned text table, fastest first."""
    lines = [list(COLUMNS), *(cells(r) for r in rows)]
    widths = [max(len(line[k]) for line in lines) for k in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) if k < 2 else c.rjust(w) for k, (c, w) in enumerate(zip(line, widths)))
                     .rstrip() for line in lines)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The same table in Markdown."""
    out = ["| " + " | ".join(COLUMNS[:-1]) + " | |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(out + ["| " + " | ".join(cells(r)) + " |" for r in rows])


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """The rows as CSV (empty cells: no value)."""
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: "" if v is None else " ".join("" if t is None else f"{t:.6g}" for t in v)
                          if isinstance(v, list) else v for k, v in r.items()} for r in rows)


def kept_flags(command_line: tuple[str, ...]) -> list[str]:
    """The probe's arguments without those the recommendation replaces (REPLACED, in any of their
    spellings: --steps 50, --steps=50, -s 1, -s1, --no-adapt)."""
    actions = build_parser()._option_string_actions
    drop = {s for name in REPLACED for s in actions[name].option_strings}
    kept, args, k = [], list(command_line[1:]), 0
    while k < len(args):
        arg = args[k]
        name = arg.split("=", 1)[0]
        if name in drop:
            k += 1 if "=" in arg or actions[name].nargs == 0 else 2
            continue
        if arg.startswith("-s") and arg[2:].isdigit():  # -s2
            k += 1
            continue
        kept.append(arg)
        k += 1
    return kept


def train_commands(probe: Probe, choice: CandidateResult) -> list[str]:
    """The commands that run the recommended scheme as the probe ran (its other options kept; add
    your run's --steps and --out): on this machine and with launch/slurm/train.sbatch."""
    flags = [*kept_flags(probe.command_line), "--scheme", choice.scheme,
             *([] if choice.s is None else ["-s", str(choice.s)]), *choice.flags]
    text = shlex.join(flags)
    n = probe.workers
    if probe.from_fit:
        script = probe.command_line[0] if probe.command_line else "your_script.py"
        return [f"mpiexec -n {n + 1} python {script} {text}",
                f"PGC_SCRIPT={script} sbatch -n {n + 1} --export=ALL,PGC_VENV=$VIRTUAL_ENV "
                f"launch/slurm/train.sbatch {text}"]
    return [f"pgc-train flags: {text}",
            f"launch/local.sh {n} {text}",
            f"sbatch -n {n + 1} --export=ALL,PGC_VENV=$VIRTUAL_ENV launch/slurm/train.sbatch {text}"]


def figure(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Time to target per candidate with its 95% interval (horizontal bars, fastest on top)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plot import SCHEME_COLORS

    shown = [r for r in rows if r["time_to_target"] is not None]
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(shown) + 1.2))
    for k, r in enumerate(reversed(shown)):
        low = r["time_low"] if r["time_low"] is not None else r["time_to_target"]
        high = r["time_high"] if r["time_high"] is not None else r["time_to_target"]
        ax.barh(k, r["time_to_target"], color=SCHEME_COLORS.get(r["scheme"], "tab:pink"), alpha=0.6,
                edgecolor="black" if r["recommended"] else "none", linewidth=2)
        ax.errorbar(r["time_to_target"], k, xerr=[[r["time_to_target"] - low], [high - r["time_to_target"]]],
                    color="tab:red", capsize=3)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([r["scheme"] + ("" if r["s"] is None else f" s={r['s']}") + (" *" if r["recommended"] else "")
                        for r in reversed(shown)])
    ax.set_xlabel("simulated time to target (s), mean and 95% interval over seeds; * recommended")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
