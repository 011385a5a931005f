"""pgc-bench's results: the finished runs of a campaign summarized into results.csv, results.md
(means with 95% intervals over seeds, paired ratios to dgd, who reaches the target first) and
figures."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path
from typing import Any, NamedTuple

from ..config import TrainConfig
from ..core.traits import S_FREE
from ..runs.results import PAPER_RUN, RunSummary, lost_detail_note, read_steps, run_completed, summarize_run
from ..runs.stats import Interval, interval


class RunKey(NamedTuple):
    """One run of an experiment: scheme, s, delay model (an index into the experiment's delays), seed."""

    scheme: str
    s: int
    delay: int
    seed: int

    def describe(self, exp: dict[str, Any]) -> str:
        """'pgc-cr s=1 delay=exp:0.05 seed=2' (the delay only where the experiment varies it)."""
        delay = f" delay={exp['delays'][self.delay]}" if exp["delay_axis"] else ""
        return f"{self.scheme} s={self.s}{delay} seed={self.seed}"


SUMMARY_KEYS = ("time_to_target", "steps_to_target", "median_step_time", "step_time_vs_dgd", "time_vs_dgd",
                "steps_vs_dgd", "final_test_accuracy", "utilization", "wasted_gradients", "bytes_per_step",
                "max_staleness", "steps_to_target_decoded", "time_to_target_decoded", "steps_vs_dgd_decoded",
                "time_vs_dgd_decoded")
# paired ratios to dgd: each of these is the run's figure over dgd's with the same seed and delay model
RATIOS = {"time_vs_dgd": "time_to_target", "steps_vs_dgd": "steps_to_target",
          "time_vs_dgd_decoded": "time_to_target_decoded", "steps_vs_dgd_decoded": "steps_to_target_decoded"}


def aggregate(rows: list[RunSummary]) -> list[dict[str, Any]]:
    """Per (delay model, scheme, s): the mean and 95% interval over seeds of every figure; the
    ratios to dgd are taken seed by seed against dgd's run with the same seed and delay model."""
    dgd = {(r.delay, r.seed): r for r in rows if r.scheme == "dgd"}
    groups: dict[tuple[str, str, int], list[RunSummary]] = {}
    for r in rows:
        groups.setdefault((r.delay, r.scheme, r.s), []).append(r)
    out = []
    for (delay, scheme, s), runs in groups.items():
        row: dict[str, Any] = {"delay": delay, "scheme": scheme, "s": "-" if scheme in S_FREE else s,
                               "runs": len(runs), "reached": sum(r.time_to_target is not None for r in runs),
                               "reached_decoded": sum(r.time_to_target_decoded is not None for r in runs),
                               "seeds": [r.seed for r in runs]}
        for key in SUMMARY_KEYS:
            row[key] = interval([_figure(r, key, dgd.get((r.delay, r.seed))) for r in runs])
        out.append(row)
    return out


def _figure(r: RunSummary, key: str, dgd: RunSummary | None) -> float:
    """One run's value of a summary figure (nan when it has none, e.g. the target never reached)."""
    if key in RATIOS:
        mine, base = getattr(r, RATIOS[key]), getattr(dgd, RATIOS[key]) if dgd is not None else None
        return mine / base if mine is not None and base else math.nan
    value = getattr(r, key)
    return math.nan if value is None else float(value)


def winners(rows: list[dict[str, Any]], summaries: list[RunSummary]) -> list[str]:
    """Per delay model and s: the scheme with the shortest mean time to target (among those that
    reached it on every seed), and whether its lead over the runner-up is outside the noise
    (the 95% interval of their per-seed differences excludes 0)."""
    by_run = {(r.delay, r.scheme, r.seed, "-" if r.scheme in S_FREE else r.s): r for r in summaries}
    lines = []
    for delay in dict.fromkeys(r["delay"] for r in rows):
        for s in sorted({r["s"] for r in rows if r["delay"] == delay and r["s"] != "-"}) or ["-"]:
            field = [r for r in rows if r["delay"] == delay and r["s"] in (s, "-") and r["reached"] == r["runs"]
                     and not math.isnan(r["time_to_target"].mean)]
            field.sort(key=lambda r: r["time_to_target"].mean)
            if not field:
                lines.append(f"| {delay} | {s} | no scheme reached the target on every seed | | |")
                continue
            first = field[0]
            if len(field) == 1:
                lines.append(f"| {delay} | {s} | {first['scheme']} | (alone) | |")
                continue
            second = field[1]
            diffs = [_time(by_run, delay, second, seed) - _time(by_run, delay, first, seed) for seed in first["seeds"]]
            lead = interval(diffs)
            verdict = "yes" if lead.excludes(0.0) else "no (within noise)"
            lines.append(f"| {delay} | {s} | {first['scheme']} | {second['scheme']} (+{lead}) | {verdict} |")
    return ["| delay | s | fastest to target | runner-up (time behind, 95% CI) | lead outside noise |",
            "|---|---|---|---|---|", *lines]


def _time(by_run: dict, delay: str, row: dict[str, Any], seed: int) -> float:
    """The time to target of one seed's run of an aggregated row (nan if missing or never reached)."""
    r = by_run.get((delay, row["scheme"], seed, row["s"]))
    return r.time_to_target if r is not None and r.time_to_target is not None else math.nan


def markdown_table(rows: list[dict[str, Any]], has_target: bool = True) -> str:
    """The aggregated results as Markdown: one table per delay model, mean [95% CI] over seeds."""
    head = ["scheme", "s", "seeds", "reached", "time to target (s)", "steps to target", "median step (s)",
            "step vs dgd", "time vs dgd", "final test acc", "utilization", "wasted grads", "MB recv/step",
            "max stale"]
    keys = ["time_to_target", "steps_to_target", "median_step_time", "step_time_vs_dgd", "time_vs_dgd",
            "final_test_accuracy", "utilization", "wasted_gradients", "bytes_per_step", "max_staleness"]
    out = []
    for delay in dict.fromkeys(r["delay"] for r in rows):
        out += [f"### delay {delay}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (r for r in rows if r["delay"] == delay):
            cells = [r["scheme"], str(r["s"]), str(r["runs"]), f"{r['reached']}/{r['runs']}" if has_target else "-"]
            for key in keys:
                value = r[key]
                if key == "bytes_per_step":
                    value = Interval(*(v / 1e6 for v in (value.mean, value.low, value.high)), value.k)
                cells.append(str(value))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def stopping_rules_table(rows: list[dict[str, Any]]) -> str:
    """Steps to target under both stopping rules, with their paired ratios to dgd: the full
    training loss at an evaluation, and the paper's rule (the decoded training loss at or below
    the target for 3 consecutive steps), as Markdown, one table per delay model."""
    head = ["scheme", "s", "reached (full)", "steps (full)", "steps vs dgd (full)", "reached (decoded)",
            "steps (decoded)", "steps vs dgd (decoded)", "time vs dgd (decoded)"]
    out = []
    for delay in dict.fromkeys(r["delay"] for r in rows):
        out += [f"### delay {delay}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (r for r in rows if r["delay"] == delay):
            out.append("| " + " | ".join([
                r["scheme"], str(r["s"]), f"{r['reached']}/{r['runs']}", str(r["steps_to_target"]),
                str(r["steps_vs_dgd"]), f"{r['reached_decoded']}/{r['runs']}", str(r["steps_to_target_decoded"]),
                str(r["steps_vs_dgd_decoded"]), str(r["time_vs_dgd_decoded"])]) + " |")
        out.append("")
    return "\n".join(out)


def run_dir_of(out: Path, exp: dict[str, Any], key: RunKey) -> Path:
    """Where one run's outputs go."""
    delay = f"-d{key.delay}" if exp["delay_axis"] else ""
    return out / f"{key.scheme}-s{key.s}{delay}-seed{key.seed}"


def gather(exp: dict[str, Any], out: Path, todo: list[RunKey]) -> int:
    """Summarize the finished runs under `out` into results.csv, results.md and figures."""
    finished = {key: run_dir_of(out, exp, key) for key in todo if run_completed(run_dir_of(out, exp, key))}
    missing = [key for key in todo if key not in finished]
    for key in missing:
        print(f"no completed run for {key.describe(exp)} in {out}", file=sys.stderr)
    if not finished:
        return 1
    dgd = {(key.delay, key.seed): summarize_run(d, None).median_step_time for key, d in finished.items()
           if key.scheme == "dgd"}
    rows = [summarize_run(d, exp["target_loss"], dgd.get((key.delay, key.seed))) for key, d in finished.items()]
    with (out / "results.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0].as_row()))
        writer.writeheader()
        writer.writerows(r.as_row() for r in rows)
    target = exp["target_loss"]
    aggregated = aggregate(rows)
    table = markdown_table(aggregated, has_target=target is not None)
    train = exp["train"]
    decisions = (f"FR schemes decode: {train.get('fr_decode', 'covered')}; staleness bound: "
                 f"{train.get('max_staleness', 'window')} (--on-stale {train.get('on_stale', 'refresh')})")
    text = (f"# {exp['name']}\n\n{exp['workers']} workers; target loss {target if target is not None else '-'}; "
            f"mean [95% confidence interval] over seeds {exp['seeds']}; ratios to dgd paired by seed and delay "
            f"model; {decisions}; options {exp['train']}\n\n{table}\n")
    if target is not None:
        text += "\n## Who reaches the target first\n\n" + "\n".join(winners(aggregated, rows)) + "\n"
        text += ("\n## Steps to target under both stopping rules\n\nfull: the full training loss at an evaluation "
                 f"(every {train.get('eval_every', TrainConfig.eval_every)} steps) at or below the target; decoded "
                 "(the paper's rule): each step's mean minibatch loss over the messages the master used at or below "
                 f"the target for {PAPER_RUN} consecutive steps\n\n" + stopping_rules_table(aggregated) + "\n")
    notes = [note for r, d in zip(rows, finished.values()) if r.steps_detail_lost
             and (note := lost_detail_note(d.name, read_steps(d)))]
    if notes:
        text += "\n## Runs with lost per-message detail\n\n" + "\n".join(f"- {note}" for note in notes) + "\n"
        for note in notes:
            print(f"pgc-bench: {note}", file=sys.stderr)
    (out / "results.md").write_text(text)
    print(text)
    from .plot import PLOT_EXTRA, draw, draw_ratios, have_matplotlib

    if not have_matplotlib():
        print(f"pgc-bench: no figures: they need matplotlib: {PLOT_EXTRA}", file=sys.stderr)
        return 1 if missing else 0

    # runs that started but did not complete are drawn too, marked (not silently dropped)
    started = [run_dir_of(out, exp, key) for key in todo if (run_dir_of(out, exp, key) / "metrics.jsonl").is_file()]
    for f in draw(started, out, target):
        print(f)
    if target is not None and any(r["scheme"] == "dgd" for r in aggregated):
        print(draw_ratios(aggregated, out, f"{exp['name']}: {exp['workers']} workers, seeds {exp['seeds']}"))
    return 1 if missing else 0
