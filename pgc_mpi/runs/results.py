"""What a run's metrics.jsonl says, reduced to the numbers a scheme comparison is made of.

Two stopping rules tell when a run reached a target loss: the full training loss at an
evaluation (`curve`; the project's rule), and the paper's rule (`first_sustained`): the decoded
training loss, i.e. a step's mean minibatch loss over the messages the master used, at or below
the target for 3 consecutive steps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..core.message import MessageRecord
from .message_log import with_messages
from .metrics import read_json, read_metrics


def read_steps(out_dir: Path) -> list[dict]:
    """The step records of a run folder (metrics.jsonl without its events), each with its
    `messages`, `arrivals`, `used`, `rejected`, and `versions` (coded schemes) or `ages` (pbs)
    from messages.bin, as the master's record had them (in their JSON form: see
    pgc_mpi.runs.message_log)."""
    records = read_metrics(Path(out_dir) / "metrics.jsonl")
    return with_messages([r for r in records if "event" not in r], out_dir)


@dataclass
class RunSummary:
    """One run's figures of merit (None where the run never reached the target)."""

    run: str
    scheme: str
    s: int
    delay: str
    seed: int
    steps: int
    median_step_time: float
    step_time_vs_dgd: float | None
    steps_to_target: int | None
    time_to_target: float | None
    steps_to_target_decoded: int | None  # the paper's rule (first_sustained)
    time_to_target_decoded: float | None
    final_test_accuracy: float | None
    utilization: float
    wasted_gradients: int
    bytes_per_step: float
    max_staleness: int
    mean_staleness: float
    steps_detail_lost: int = 0  # steps whose per-message detail messages.bin lost (see lost_detail)

    def as_row(self) -> dict:
        return asdict(self)


def load_run(run_dir: Path) -> tuple[dict, list[dict], list[dict], str]:
    """(config, per-step records with their per-message lists (from messages.bin), eval records, how it
    ended: run_status) of one run directory."""
    config = read_json(Path(run_dir) / "config.json")
    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    steps = with_messages([r for r in records if "event" not in r], run_dir)
    return config, steps, [r for r in records if r.get("event") == "eval"], run_status(records)


def lost_detail(steps: list[dict]) -> list[int]:
    """The steps whose per-message detail is lost (their messages.bin block is damaged or missing)."""
    return [r["step"] for r in steps if r.get("detail_lost")]


def lost_detail_note(run: str, steps: list[dict]) -> str | None:
    """One line naming a run whose messages.bin lost detail, and what that leaves out (None: whole)."""
    from .message_log import step_ranges

    lost = lost_detail(steps)
    if not lost:
        return None
    return (f"{run}: the per-message detail of {len(lost)} of {len(steps)} steps is lost ({step_ranges(lost)}; "
            f"messages.bin damaged): its utilization and wasted gradients count the other steps only")


def run_status(records: list[dict]) -> str:
    """How a run ended, from its metrics records: its summary's status ("completed", "stopped by
    SIGTERM", a divergence...), or "running or killed" when it has none."""
    summary = next((r for r in reversed(records) if r.get("event") == "summary"), None)
    return "running or killed" if summary is None else str(summary.get("status", "completed"))


def run_completed(run_dir: Path) -> bool:
    """Whether a run directory holds a finished run: its metrics end with a "completed" summary
    (a metrics file cut short by a crash mid-line is not one)."""
    path = Path(run_dir) / "metrics.jsonl"
    return path.is_file() and run_status(read_metrics(path)) == "completed"  # damaged lines: skipped


def stopped_by_callback(run_dir: Path) -> int | None:
    """The steps of a run whose last summary says a callback stopped it (None: not such a run)."""
    path = Path(run_dir) / "metrics.jsonl"
    records = read_metrics(path) if path.is_file() else []  # damaged lines: skipped
    summaries = [r for r in records if r.get("event") == "summary"]
    if summaries and summaries[-1].get("stopped_by") == "callback":
        return int(summaries[-1]["steps"])
    return None


def curve(steps: list[dict], evals: list[dict]) -> tuple[list[int], list[float], list[float]]:
    """(step, wall time, loss) points: the full training loss at evaluations when there is one,
    else the test loss."""
    wall = {r["step"]: r["wall_time"] for r in steps}
    key = "train_loss" if evals and "train_loss" in evals[0] else "test_loss"
    pts = [(e["step"], wall.get(e["step"], math.nan), e[key]) for e in evals if e.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]


PAPER_RUN = 3  # the paper's rule: this many consecutive logged steps at or below the threshold


def first_sustained(steps: list[dict], threshold: float, run: int = PAPER_RUN, key: str = "train_loss") -> dict | None:
    """The step record at which `key` (the decoded training loss) has been <= threshold for `run`
    consecutive steps: where the paper's rule stops the run (None if it never does; a step with
    no value, NaN, breaks the run of steps)."""
    count = 0
    for record in steps:
        count = count + 1 if record.get(key, math.inf) <= threshold else 0
        if count == run:
            return record
    return None


def summarize_run(run_dir: Path, target_loss: float | None, dgd_median: float | None = None) -> RunSummary:
    """The figures of merit of one run; step_time_vs_dgd needs dgd's median step time of the same trace."""
    config, steps, evals, _ = load_run(run_dir)
    cfg = config["config"]
    n = int(config["workers"])
    step_times = [r["step_time"] for r in steps]
    median = float(np.median(step_times)) if step_times else math.nan
    hit_step = hit_time = None
    if target_loss is not None:
        for step, wall, loss in zip(*curve(steps, evals)):
            if loss <= target_loss:
                hit_step, hit_time = step + 1, wall
                break
    decoded = first_sustained(steps, target_loss) if target_loss is not None else None
    messages = [MessageRecord(*m) for r in steps for m in r.get("messages", [])]
    compute = sum(m.compute_time for m in messages if m.verdict != "rejected")
    wall_total = steps[-1]["wall_time"] if steps else math.nan
    final = evals[-1].get("test_accuracy") if evals else None
    staleness = [r["max_staleness"] for r in steps]
    return RunSummary(
        run=Path(run_dir).name, scheme=cfg["scheme"], s=int(cfg["stragglers"]), delay=str(cfg.get("delay", "none")),
        seed=int(cfg["seed"]),
        steps=len(steps), median_step_time=median,
        step_time_vs_dgd=median / dgd_median if dgd_median else None,
        steps_to_target=hit_step, time_to_target=hit_time,
        steps_to_target_decoded=decoded["step"] + 1 if decoded else None,
        time_to_target_decoded=decoded["wall_time"] if decoded else None, final_test_accuracy=final,
        utilization=compute / (n * wall_total) if wall_total and wall_total > 0 else math.nan,
        wasted_gradients=int(sum(m.gradients for m in messages if m.verdict != "used")),
        bytes_per_step=steps[-1]["bytes_received"] / len(steps) if steps else math.nan,
        max_staleness=int(max(staleness, default=0)), mean_staleness=float(np.mean(staleness)) if staleness else 0.0,
        steps_detail_lost=len(lost_detail(steps)),
    )


@dataclass(frozen=True)
class WaitEstimate:
    """What not waiting for every worker saved, estimated from the jobs the master saw."""

    seconds: float  # summed over steps: the slowest job of the step minus the slowest job used
    steps: int  # steps the estimate covers
    steps_complete: int  # steps for which a message of every worker was seen (elsewhere: a lower bound)


def waiting_saved(steps: list[dict], workers: int) -> WaitEstimate | None:
    """How much longer the steps would have taken had the master waited for every worker's message.

    For each step t: the longest job among every message for t the master received (used,
    accepted, late or over-stale; a job's time is its compute time plus its injected delay, as
    the worker reports them) minus the longest job among the messages the step used. Waiting for
    all would have ended the step when the slowest job did; the step ended with the slowest job
    it used (both include the same start and message costs, which cancel). A worker whose
    message for t never arrived (hung, or busy with a late job) makes that step's figure a lower
    bound. None for pbs (every message is one partition's gradient: there is no "every worker's
    message of step t") and for runs without per-message records."""
    jobs: dict[int, dict[int, float]] = {}  # step -> worker -> job time
    used: dict[int, float] = {}
    for record in steps:
        if "ages" in record:  # pbs
            return None
        for m in map(MessageRecord._make, record.get("messages", [])):
            if m.verdict == "rejected":
                continue
            job = m.compute_time + m.delay
            jobs.setdefault(m.step, {})[m.worker] = job
            if m.verdict == "used":
                used[m.step] = max(used.get(m.step, 0.0), job)
    if not used:
        return None
    saved = sum(max(0.0, max(jobs[t].values()) - used[t]) for t in used)
    complete = sum(len(jobs[t]) == workers for t in used)
    return WaitEstimate(saved, len(used), complete)


def realized_delays(run_dir: Path) -> list[tuple[int, int, float]]:
    """(worker, step, injected delay) of every message a run's master received: a replayable trace."""
    _, steps, _, _ = load_run(run_dir)
    messages = [MessageRecord(*m) for r in steps for m in r.get("messages", [])]
    seen = {(m.worker, m.step): m.delay for m in messages if m.verdict != "rejected"}
    return [(w, s, d) for (w, s), d in sorted(seen.items())]
