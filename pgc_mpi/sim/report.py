"""pgc-sim's comparison table: per scheme, steps and simulated time to a target gap or loss, over seeds.

Imports neither torch nor the simulator (SimResult is only a type here), so that pgc-sim's
configuration errors stay fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core.message import MessageRecord
from ..runs.results import PAPER_RUN, first_sustained

if TYPE_CHECKING:
    from .simulator import SimResult

_LOSS_WORDS = {"train_loss": "training loss", "test_loss": "test loss"}
_LOSS_SOURCES = {"train_loss": "the whole training set", "test_loss": "the test set, --no-eval-train"}


@dataclass(frozen=True)
class Target:
    """What the runs are measured against: the optimality gap of a synthetic problem (`gap`) or a
    loss (`loss`: the evaluation's training loss, its test loss where it has none), the threshold
    (None: no target, only the final value is reported) and how often the problem is evaluated."""

    kind: str  # "gap" or "loss"
    value: float | None
    eval_every: int = 1

    def key(self, res: SimResult) -> str:
        """The record key a run is measured by: `gap`, or the loss its evaluations report."""
        return "gap" if self.kind == "gap" else res.loss_key

    def describe(self, key: str) -> str:
        """The table header's first words: the target and, when sparse, the evaluation cadence."""
        if self.kind == "gap":
            text = f"target gap {self.value:g}"
        elif self.value is None:
            text = f"no target loss (--target-loss); final loss: the {_LOSS_WORDS[key]} on {_LOSS_SOURCES[key]}"
        else:
            text = f"target {_LOSS_WORDS[key]} {self.value:g} (on {_LOSS_SOURCES[key]})"
        if self.eval_every > 1:
            text += f", evaluated every {self.eval_every} steps and after the last"
        return text


def _per_seed(res: SimResult, target: Target, dgd: SimResult | None) -> dict:
    """One simulated run's figures (a row of one seed)."""
    key = target.key(res)
    hit = res.first_below(key, target.value) if target.value is not None else None
    records = res.records
    decoded = first_sustained(records, target.value) if target.kind == "loss" and target.value is not None else None
    gradients = sum(MessageRecord._make(m).gradients for r in records for m in r["messages"])
    return {
        "steps_to_target": hit["step"] + 1 if hit else None,
        "time_to_target": hit["wall_time"] if hit else None,
        "steps_to_target_decoded": decoded["step"] + 1 if decoded else None,
        "median_step_time": res.median_step_time(),
        "step_time_vs_dgd": res.median_step_time() / dgd.median_step_time() if dgd is not None else math.nan,
        "final": res.final(key),
        "final_accuracy": res.final("test_accuracy"),
        "max_staleness": max((r["max_staleness"] for r in records), default=0),
        "late_messages": sum(r["late"] for r in records),
        "abandoned": sum(r.get("abandoned", 0) for r in records),
        "stale_rejected": sum(r.get("stale_rejected", 0) for r in records),
        "gradients_per_step": gradients / len(records) if records else math.nan,
        "stalled": res.stalled,
    }


def summarize(results: dict[str, list[SimResult]], target: Target) -> list[dict]:
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
        for key in ("steps_to_target", "time_to_target", "steps_to_target_decoded", "median_step_time",
                    "step_time_vs_dgd", "final", "final_accuracy", "late_messages", "stale_rejected",
                    "gradients_per_step", "abandoned"):
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


def _cells(r: dict, target: Target, accuracy: bool, abandoned: bool) -> list[str]:
    """One scheme's row of the table."""
    final = r["final"]
    cells = [
        r["scheme"],
        f"{r['reached']}/{r['seeds']}" if target.value is not None else "-",
        _spread(r, "steps_to_target", ".1f"),
        *([_spread(r, "steps_to_target_decoded", ".1f")] if target.kind == "loss" else []),
        _spread(r, "time_to_target", ".1f"),
        _spread(r, "median_step_time", ".3f"),
        _spread(r, "step_time_vs_dgd", ".2f"),
        "-" if final is None else f"{final:.2e}" if target.kind == "gap" else f"{final:.4g}",
    ]
    if accuracy:
        cells.append(_spread(r, "final_accuracy", ".4f"))
    return cells + [
        _spread(r, "gradients_per_step", ".2f"),
        str(r["max_staleness"]),
        f"{r['stale_rejected']:.0f}",
        f"{r['late_messages']:.0f}" + ("" if abandoned else " STALLED" if r["stalled"] else ""),
        *([f"{r['abandoned'] or 0:.0f}" + (" STALLED" if r["stalled"] else "")] if abandoned else []),
    ]


def format_table(rows: list[dict], target: Target, key: str, fr_decode: str = "covered", header: str = "") -> str:
    """The comparison as an aligned text table, headed by what it depends on (target, rules, seeds);
    `key` is the record key the runs were measured by (gap, train_loss or test_loss). A column of
    final test accuracies is added when the evaluations report one (torch classifiers)."""
    word = target.kind
    accuracy = any(r["final_accuracy"] is not None and not math.isnan(r["final_accuracy"]) for r in rows)
    abandoned = any(r.get("abandoned") for r in rows)  # --abandon-late: jobs abandoned, per run
    head = ["scheme", "reached", f"steps to {word}", *(["steps, decoded rule"] if word == "loss" else []),
            f"time to {word}", "median step", "vs dgd", f"final {word}",
            *(["test acc"] if accuracy else []), "grads/step", "max stale", "rejected", "late",
            *(["abandoned"] if abandoned else [])]
    lines = [head, *(_cells(r, target, accuracy, abandoned) for r in rows)]
    widths = [max(len(row[k]) for row in lines) for k in range(len(head))]
    seeds = rows[0]["seeds"] if rows else 0
    out = [f"{target.describe(key)}; times in simulated seconds; FR schemes decode: {fr_decode}; "
           f"{seeds} seed(s): mean±sd over seeds (times and steps over the seeds that reached the target), "
           f"rejected/late{'/abandoned' if abandoned else ''}: mean per run{header}" + (
               f"; steps, decoded rule: the paper's stopping rule, each step's mean minibatch loss over the messages "
               f"used at or below the target for {PAPER_RUN} consecutive steps" if word == "loss" else "")]
    for row in lines:
        out.append("  ".join(cell.rjust(w) if k else cell.ljust(w) for k, (cell, w) in enumerate(zip(row, widths))))
    return "\n".join(out)
