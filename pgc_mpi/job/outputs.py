"""Rank 0's outputs of a run: config.json and the first log line at the start (open_outputs),
the summary record, params.npy and the printed report at the end (close_outputs), and the
"failed" summary any rank appends when the run fails (record_failure)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import TrainConfig
from ..core.traits import traits
from ..runs import run_folder
from ..runs.metrics import MetricsWriter, Progress, json_line, read_json, write_json
from ..runs.results import read_steps
from . import provenance

# Schemes for which --stragglers means nothing, so the log and the report leave s out: dgd waits for
# every worker and ddp's all-reduce needs every peer.


def record_failure(cfg: TrainConfig, rank: int, reason: str) -> None:
    """Append a "failed" summary with its one-line reason to the run's metrics, from whichever rank
    failed, so that the folder says how the run ended (rank 0 writes the file in append mode too:
    whole lines appended by two ranks never overwrite each other)."""
    path = Path(cfg.out) / "metrics.jsonl"
    if not path.is_file():  # failed before the run's outputs existed: the error message is all there is
        return
    record = {"event": "summary", "status": "failed", "reason": reason.splitlines()[0] if reason else "", "rank": rank}
    try:
        with path.open("a") as fh:
            fh.write(json_line(record))
    except OSError:  # the disk that failed the run may fail this too: the log has the reason
        pass


def open_outputs(cfg: TrainConfig, comm, log, scheme, problem, start: dict,
                  resume=None) -> tuple[Path, MetricsWriter, Progress]:
    """Rank 0's outputs at the start of every run: the folder cleared with --overwrite,
    metrics.jsonl (after a resume, with the earlier steps kept), config.json with the run's
    provenance (the earlier starts' too after a resume), the first log line and the progress display."""
    out = Path(cfg.out)
    previous = None
    if cfg.overwrite and run_folder.holds_run(out):
        log.info("--overwrite: deleting the outputs of the run in %s", out)
        run_folder.clear(out)
    recorded: dict = {}
    if not cfg.overwrite and resume is not None and (out / "config.json").is_file():
        recorded = read_json(out / "config.json")
        previous = recorded.get("provenance")
    changes = list(recorded.get("worker_changes", []))
    if resume is not None and resume.workers_before is not None:
        changes.append({"step": resume.step, "workers_before": resume.workers_before, "workers": scheme.n})
        log.warning("resuming at step %d with %d workers, not the checkpoint's %d: the placement%s rebuilt for "
                    "n=%d and the training data re-split %d ways%s; parameters, optimizer state and RNG carry over",
                    resume.step, scheme.n, resume.workers_before,
                    " and encoding are" if scheme.kind == "coded" else " is", scheme.n, scheme.n,
                    ", pbs's table starts empty" if scheme.kind == "table" else "")
    data, data_changes = _data_record(problem, recorded, resume, log)
    metrics = MetricsWriter(out, keep_steps_before=resume.step if resume else None)
    write_json(out / "config.json", {"config": cfg.to_dict(), "world_size": comm.Get_size(), "workers": scheme.n,
                                     **cfg.scheme_shape(scheme), "parameters": problem.dim,
                                     "resumed_from_step": resume.step if resume else None,
                                     "worker_changes": changes,
                                     "data_fingerprint": data, "data_changes": data_changes,
                                     "provenance": provenance.with_earlier_starts(start, previous)})
    log.info("%s with n=%d workers%s, c=%d; %s (%d parameters, %s); output in %s", cfg.scheme, scheme.n,
             "" if traits(cfg.scheme).waits_for_all else f", s={scheme.s}", scheme.c, cfg.describe_problem(),
             problem.dim, cfg.dtype, out)
    return out, metrics, Progress(cfg.steps, cfg.log_interval, log)


def _data_record(problem, recorded: dict, resume, log) -> tuple[dict | None, list[dict]]:
    """config.json's `data_fingerprint` (pgc_mpi.learning.fingerprint: what a resume must train on,
    run_folder.check_same_data; None for an HDF5 file or a synthetic problem) and `data_changes`: the
    earlier ones, and this resume's where --resume-other-data let it continue on other data."""
    from ..learning.fingerprint import problem_fingerprint

    data = problem_fingerprint(problem)
    changes = list(recorded.get("data_changes", []))
    before = recorded.get("data_fingerprint")
    if resume is not None and before and data is not None and before != data:
        changes.append({"step": resume.step, "data_fingerprint_before": before})
        log.warning("resuming at step %d on other data than the run was trained on (resume_other_data): "
                    "config.json records the change (data_changes)", resume.step)
    return data, changes


# The summary's status of a run that a callback stopped (early stopping...): finished, not to be
# continued by --resume auto (pgc_mpi.runs.run_folder).
STOPPED_BY_CALLBACK = "stopped by callback"


def close_outputs(cfg: TrainConfig, scheme, totals, control, wall: float, metrics: MetricsWriter, progress: Progress,
                   trajectory: list[np.ndarray], servers: list[dict] | None = None, *, prog: str) -> dict:
    """Rank 0's outputs at the end of every run: the summary record (with --servers, what each
    server received), params.npy and the printed report (headed by `prog`). Returns the summary."""
    progress.close()
    summary = _summary(totals, control, wall, metrics.path, scheme.n)
    if servers is not None:
        summary["servers"] = servers
    metrics.write(summary)
    if cfg.record_params:
        np.save(Path(cfg.out) / "params.npy", np.stack(trajectory))
    _report(cfg, scheme, summary, control.last_eval, Path(cfg.out), prog)
    return summary


def _summary(totals, control, wall: float, metrics_path: Path, workers: int) -> dict:
    """The run's final `summary` record."""
    from ..runs.results import waiting_saved

    # from the file, not the Master: after a resume it also holds the steps of the earlier part
    steps = read_steps(metrics_path.parent)  # with their per-message lists, from messages.bin
    step_times = [r["step_time"] for r in steps]
    saved = waiting_saved(steps, workers)
    lost = getattr(totals, "lost", None)
    by_callback = getattr(control, "stopped_by_callback", False)
    status = totals.diverged or (f"stopped by {control.stopped_by}" if control.stopped_by else
                                 f"workers lost: {lost}" if lost else STOPPED_BY_CALLBACK if by_callback else
                                 "completed")
    return {"event": "summary", "status": status,
            "stopped_by": control.stopped_by or ("callback" if by_callback else None),
            "steps": totals.steps, "wall_time": wall,
            "median_step_time": float(np.median(step_times)) if step_times else None,
            "stragglers_skipped": totals.skipped, "late_messages": totals.late,
            "abandoned_jobs": getattr(totals, "abandoned", 0),  # --abandon-late: decided jobs dropped
            "rejected_stale": totals.rejected, "rejected_messages": totals.rejected_messages,
            "deadline_missed": totals.deadline_missed, "stopped_at_target": control.stopped_early,
            "waiting_saved_estimate": saved.seconds if saved else None,
            "waiting_saved_lower_bound_steps": saved.steps - saved.steps_complete if saved else None,
            **{f"final_{k}": v for k, v in control.last_eval.items()}}


def _report(cfg: TrainConfig, scheme, summary: dict, last_eval: dict, out: Path, prog: str) -> None:
    """The few lines a run prints at the end."""
    scores = ", ".join(f"{k.replace('_', ' ')} {100 * v:.1f}%" if k.endswith("accuracy") else
                       f"{k.replace('_', ' ')} {v:.4f}" for k, v in last_eval.items() if k != "step")
    print(f"{prog}: {_scheme_label(cfg.scheme, scheme)} on {cfg.describe_problem()}: "
          f"{summary['steps']} steps in {summary['wall_time']:.1f} s, median step "
          f"{1e3 * (summary['median_step_time'] or 0):.1f} ms\n"
          f"  {scores}\n"
          f"  stragglers skipped {summary['stragglers_skipped']} worker-steps, late messages "
          f"{summary['late_messages']}{_abandoned(cfg, summary)}, over-stale messages rejected "
          f"{summary['rejected_stale']}, "
          f"deadline misses {summary['deadline_missed']}\n{_saved_line(summary)}  outputs: {out}", flush=True)


def _abandoned(cfg: TrainConfig, summary: dict) -> str:
    """The report's count of dropped decided jobs, with --abandon-late (where the scheme may drop)."""
    return f", decided jobs abandoned {summary['abandoned_jobs']}" if cfg.abandons_late() else ""


def _scheme_label(name: str, scheme) -> str:
    """"pgc-cr (n=4, s=1)"; "dgd (n=4)" where s means nothing (a scheme that waits for every worker)."""
    return f"{name} (n={scheme.n})" if traits(name).waits_for_all else f"{name} (n={scheme.n}, s={scheme.s})"


def _saved_line(summary: dict) -> str:
    """What not waiting for stragglers bought, as the report's line (empty where not estimated: pbs)."""
    saved = summary.get("waiting_saved_estimate")
    if saved is None:
        return ""
    bound = summary["waiting_saved_lower_bound_steps"]
    share = f" ({100 * saved / summary['wall_time']:.0f}% of the run)" if summary["wall_time"] > 0 else ""
    return (f"  waiting for every worker would have taken about {saved:.1f} s longer{share}, estimated from the "
            f"workers' job times{f' (a lower bound: {bound} steps lack a message)' if bound else ''}\n")


