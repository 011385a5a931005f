"""The worker count a run that lost workers starts again on: the largest count, at most the workers
left, that the run's options accept (launch/local.sh and launch/slurm/train.sbatch restart a run
with --resume auto on it; the command is pgc_mpi.commands.restart_count).

The rules are pgc-train's own: each count is checked by TrainConfig.validate, as rank 0 checks a
start, so none is restated here (the FR schemes' c | n, s < n, pbs's replication, --servers, the
worker ids of --delay, and any rule added later; a resumed start drops a --fault naming a worker it
lacks). Imports neither torch nor mpi4py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.traits import PEER_SCHEMES
from ..errors import PgcError
from .train import TrainConfig

# How far above the workers left to look for a count the options accept, to say what to run
# instead when none up to them does (s < n needs s + 1, an FR scheme a multiple of c, a --delay
# a worker id: all within a few counts; every count checked builds the scheme, so not unbounded).
LOOK_ABOVE = 64
# How many of the refused counts a refusal names (each reason is a sentence)
NAMED_REASONS = 3


@dataclass(frozen=True)
class RestartCount:
    """The answer of restart_count: `workers`, the largest count that fits (None: none does), and
    `why`, one line for the log: why not all the workers left and how many are left out ('' when
    all of them fit); with None, why none fits and what to run instead."""

    workers: int | None
    why: str


def refusal(cfg: TrainConfig, workers: int) -> str | None:
    """Why pgc-train would refuse to run `cfg` on `workers` workers (its own validation's message),
    or None when it would accept them."""
    try:
        cfg.validate(workers)
    except PgcError as exc:
        return str(exc)
    return None


def restart_count(cfg: TrainConfig, available: int) -> RestartCount:
    """The largest worker count <= `available` that `cfg` accepts: `available`, n - 1, ... down to 1
    (the first is the most workers, so the fastest restart), or None with the reason and the
    smallest larger count that would do."""
    if cfg.scheme in PEER_SCHEMES:
        return RestartCount(None, f"--scheme {cfg.scheme} has no checkpoints to resume from, so it is not "
                                  f"started again: run it afresh on the workers left")
    if available < 1:
        return RestartCount(None, "no worker is left: resume the run (the same options, --resume auto) when "
                                  "there are workers again")
    reasons: list[str] = []
    for workers in range(available, 0, -1):
        reason = refusal(cfg, workers)
        if reason is None:
            return RestartCount(workers, "" if workers == available else (
                f"{available} workers left, and {_what(cfg)} does not run on {available} ({reasons[0]}): "
                f"starting it again on {workers}, leaving {available - workers} out"))
        reasons.append(reason)
    if len(set(reasons)) == 1:  # the same words for every count: a refusal that no count changes
        named = reasons[0]
    else:
        named = "; ".join(f"on {available - k}: {reason}" for k, reason in enumerate(reasons[:NAMED_REASONS]))
        named += "; ..." if available > NAMED_REASONS else ""
    larger = next((n for n in range(available + 1, available + LOOK_ABOVE + 1) if refusal(cfg, n) is None), None)
    if larger is None:
        instead = "change the options that every count refuses, then resume the run (--resume auto)"
    else:
        instead = (f"resume it on {larger} workers ({larger + cfg.servers} ranks), the fewest above {available} "
                   f"that it runs on: the same options with --resume auto{f' --out {cfg.out}' if cfg.out else ''}")
    return RestartCount(None, f"{available} worker{'s' if available > 1 else ''} left and {_what(cfg)} runs on "
                              f"none of 1..{available} ({named}): {instead}")


def _what(cfg: TrainConfig) -> str:
    """The scheme in words for the log: 'pgc-fr with s = 1'."""
    return f"{cfg.scheme} with s = {cfg.stragglers}"
