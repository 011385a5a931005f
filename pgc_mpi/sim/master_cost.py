"""The master's own cost per step as a model the simulator can charge: measured, fitted, saved.

The simulator's master takes no time unless it is given a cost model (pgc-sim --master-cost
FILE). A model has the four parts of the master's work that every MPI step record carries
(`receive_time`, `decode_time`, `update_time`, `send_time`), each linear in the number of
workers N and the model's size in millions of numbers M:

    part seconds = fixed + per_worker * N + per_mnum * M

`receive` is charged per message taken in (judging it and adding it into the decoded sum), the
other three once per step. `fit` estimates the constants from real runs' step records
(benchmarks/master_cost.py --fit writes them: docs/BENCHMARKS.md, section 13), so that a
simulated 1,000-worker run includes what a real master would spend. The constants hold for the
machine, MPI and precision they were measured with (the file says which).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..runs.metrics import MASTER_PARTS

# The terms `fit` estimates for each part. Taking in a message, decoding and the optimizer's step
# touch the model's numbers once each and do not depend on how many workers there are; sending
# the new model posts one send per worker. (On one shared machine the measured times also grow
# with N because the ranks contend for its cores: a per-worker term for those parts would carry
# that contention to a 1,000-worker extrapolation, which a cluster with a core per rank does not
# have.)
FITTED_TERMS = {"receive": ("fixed", "per_mnum"), "decode": ("fixed", "per_mnum"), "update": ("fixed", "per_mnum"),
                "send": ("fixed", "per_worker", "per_mnum")}


@dataclass(frozen=True)
class PartCost:
    """Seconds of one part of the master's work: fixed + per_worker * N + per_mnum * M."""

    fixed: float = 0.0
    per_worker: float = 0.0
    per_mnum: float = 0.0

    def seconds(self, workers: int, numbers: int) -> float:
        return self.fixed + self.per_worker * workers + self.per_mnum * numbers / 1e6


TERMS = tuple(f.name for f in fields(PartCost))  # fixed, per_worker, per_mnum


@dataclass(frozen=True)
class MasterCost:
    """The master's cost model: one PartCost per part of MASTER_PARTS, and where it was measured."""

    receive: PartCost = PartCost()
    decode: PartCost = PartCost()
    update: PartCost = PartCost()
    send: PartCost = PartCost()
    measured: dict[str, Any] = field(default_factory=dict)

    def receive_seconds(self, workers: int, numbers: int) -> float:
        """The master's time to take in one message of `numbers` numbers."""
        return self.receive.seconds(workers, numbers)

    def step_seconds(self, workers: int, numbers: int) -> dict[str, float]:
        """The once-per-step parts (decode, update, send) in seconds, by part."""
        return {part: getattr(self, part).seconds(workers, numbers) for part in MASTER_PARTS if part != "receive"}

    def to_json(self) -> dict[str, Any]:
        return {"parts": {part: asdict(getattr(self, part)) for part in MASTER_PARTS},
                "formula": "seconds = fixed + per_worker * N + per_mnum * (numbers in a message) / 1e6; "
                           "receive per message, the others per step",
                "measured": self.measured}


def load(path: str | Path) -> MasterCost:
    """The cost model in a JSON file written by `save` (ConfigError naming the problem otherwise)."""
    where = f"--master-cost {path}"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file; write one with benchmarks/master_cost.py --fit FILE") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{where}: not a readable JSON cost model ({err})") from None
    parts = data.get("parts") if isinstance(data, dict) else None
    if not isinstance(parts, dict) or set(parts) != set(MASTER_PARTS):
        raise ConfigError(f"{where}: needs \"parts\" with exactly {', '.join(MASTER_PARTS)}")
    built = {}
    for part in MASTER_PARTS:
        terms = parts[part]
        if not isinstance(terms, dict) or not set(terms) <= set(TERMS):
            raise ConfigError(f"{where}: part {part!r} must map some of {', '.join(TERMS)} to seconds")
        for term, value in terms.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{where}: {part}.{term} must be a finite number of seconds >= 0, got {value!r}")
        built[part] = PartCost(**{term: float(value) for term, value in terms.items()})
    return MasterCost(**built, measured=data.get("measured") or {})


def save(cost: MasterCost, path: Path) -> None:
    """Write the cost model as JSON (what `load` and pgc-sim --master-cost read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cost.to_json(), indent=2) + "\n")


def fit(rows: Sequence[Mapping[str, float]], measured: dict[str, Any] | None = None) -> MasterCost:
    """Least-squares constants (FITTED_TERMS of each part), none negative, from measured rows:
    each has `workers`, `numbers` (per message) and the median seconds of every part (`receive`
    per message, the others per step). A term whose best fit is negative is dropped and the rest
    refitted."""
    if len(rows) < len(TERMS):
        raise ValueError(f"fitting {len(TERMS)} constants needs at least {len(TERMS)} measured rows, got {len(rows)}")
    columns = {"fixed": [1.0] * len(rows), "per_worker": [r["workers"] for r in rows],
               "per_mnum": [r["numbers"] / 1e6 for r in rows]}
    parts = {}
    for part in MASTER_PARTS:
        terms = FITTED_TERMS[part]
        x = np.array([columns[term] for term in terms], dtype=float).T
        y = np.array([r[part] for r in rows], dtype=float)
        parts[part] = PartCost(**dict(zip(terms, _nonnegative_lstsq(x, y))))
    return MasterCost(**parts, measured=measured or {})


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> list[float]:
    """|x c - y| made small over c >= 0: the most negative coefficient is dropped and the rest
    refitted until none is negative (a simple active set, enough for three terms)."""
    active, coef = list(range(x.shape[1])), np.zeros(0)
    while active:
        coef = np.linalg.lstsq(x[:, active], y, rcond=None)[0]
        if (coef >= 0).all():
            break
        active.pop(int(np.argmin(coef)))
    out = [0.0] * x.shape[1]
    for j, c in zip(active, coef):
        out[j] = float(c)
    return out
