"""Fault injection for testing a run's defences: workers that send garbage or die.

Specs (join several with '+'); W is a worker id (rank - 1; rank - K with --servers K), STEP the
first step it applies to:
  nan:W@STEP       the worker's messages carry NaN from that step on
  inf:W@STEP       ... carry +Inf
  badsize:W@STEP   its messages have the wrong size (half the bytes)
  die:W@STEP       the worker process exits abruptly at that step (as a crashed node would),
                   in a start of the run that began before STEP: a run resumed at or after
                   STEP is past that crash and does not crash again (`for_start`)
  kill:W@STEP      the same, by SIGKILL to itself (as the OOM killer would): hydra's mpiexec
                   then ends every rank on that node, -disable-auto-cleanup or not
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

KINDS = ("nan", "inf", "badsize", "die", "kill")
DEATHS = ("die", "kill")


@dataclass(frozen=True)
class Fault:
    kind: str
    worker: int
    step: int


def parse_faults(spec: str | None, n: int, elastic: bool = False) -> list[Fault]:
    """The faults of a --fault spec (none for None or 'none'). `elastic`: a resumed start, which may
    have fewer workers than the run had (a restart after a death): a fault naming a worker it does
    not have is dropped (that worker is gone), not an error; a fresh start refuses it (a typo)."""
    if not spec or spec == "none":
        return []
    faults = []
    for part in spec.split("+"):
        kind, _, rest = part.strip().partition(":")
        worker, _, step = rest.partition("@")
        if kind not in KINDS or not worker.isdigit() or not step.isdigit():
            raise ConfigError(f"--fault {spec!r}: use {'|'.join(KINDS)}:W@STEP, joined with '+'")
        if int(worker) >= n and elastic:
            continue
        if int(worker) >= n:
            raise ConfigError(f"--fault {spec!r}: worker id {worker} is outside 0..{n - 1} "
                             f"(worker id = rank - 1, or rank - K with --servers K)")
        faults.append(Fault(kind, int(worker), int(step)))
    return faults


def for_start(faults: tuple[Fault, ...] | list[Fault], start: int) -> tuple[Fault, ...]:
    """The faults of a start of the run at step `start` (0, or a resumed run's): `die` faults of
    earlier steps have happened already."""
    return tuple(f for f in faults if not (f.kind in DEATHS and f.step <= start))


def active(faults: list[Fault], worker: int, step: int) -> str | None:
    """The fault kind that hits `worker` at `step`, if any."""
    return next((f.kind for f in faults if f.worker == worker and step >= f.step), None)
