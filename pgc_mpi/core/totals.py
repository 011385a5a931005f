"""A run's totals: the counters of its steps and messages that the server's step loop keeps
(pgc_mpi.runtime.master; the ddp baseline's watch, pgc_mpi.runtime.ddp, keeps the same) and the
summary record reports (pgc_mpi.job.outputs; each server's with --servers K)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunTotals:
    """Counters for the final summary."""

    steps: int = 0
    skipped: int = 0  # worker-steps whose message did not enter the update
    late: int = 0
    rejected: int = 0  # over --max-staleness
    deadline_missed: int = 0
    rejected_messages: int = 0  # malformed or non-finite: never let into the model
    diverged: str | None = None  # why training stopped on non-finite numbers
    lost: list[int] | None = None  # the lost workers, when the run ended because a step needed them
    abandoned: int = 0  # jobs the workers dropped (--abandon-late)
