"""The built-in training callbacks' command-line specs: `--early-stop` and `--keep-best`.

    --early-stop METRIC:PATIENCE[:MODE[:MIN_DELTA]]   e.g. test_accuracy:5, train_loss:3:min:0.001
    --keep-best METRIC[:MODE]                         e.g. test_accuracy, test_loss:min

METRIC is a field of the evaluation records (train_loss, test_loss, test_accuracy, or a metric of
your own); MODE is min, max or auto (max for a metric whose name ends in "accuracy", min
otherwise); PATIENCE counts evaluations, not steps. Which metrics a run's evaluations hold is known
only when they happen, so a METRIC they lack is refused at the first evaluation
(pgc_mpi.runs.callbacks), not here.

Only parsing lives here (no torch, no mpi4py: a bad spec fails as fast as any other flag); the
callbacks themselves are in pgc_mpi.runs.callbacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError

MODES = ("min", "max", "auto")
EARLY_STOP_FORM = "METRIC:PATIENCE[:MODE[:MIN_DELTA]] (e.g. test_accuracy:5 or train_loss:3:min:0.001)"
KEEP_BEST_FORM = "METRIC[:MODE] (e.g. test_accuracy or test_loss:min)"


@dataclass(frozen=True)
class EarlyStopSpec:
    """--early-stop: stop when `metric` has not improved by more than `min_delta` for `patience`
    evaluations in a row. `mode` is resolved: "min" or "max", never "auto"."""

    metric: str
    patience: int
    mode: str
    min_delta: float = 0.0


@dataclass(frozen=True)
class KeepBestSpec:
    """--keep-best: keep the checkpoint of the evaluation with the best `metric` ("min" or "max")."""

    metric: str
    mode: str


def resolve_mode(metric: str, mode: str) -> str:
    """"min" or "max" for `metric`: `mode` itself, or for "auto" max when the name ends in
    "accuracy" (test_accuracy), min otherwise (losses). ConfigError for another mode."""
    mode = mode.strip().lower()
    if mode not in MODES:
        raise ConfigError(f"mode {mode!r} for metric {metric!r} is not one of: {', '.join(MODES)}")
    if mode == "auto":
        return "max" if metric.lower().endswith("accuracy") else "min"
    return mode


def parse_early_stop(text: str) -> EarlyStopSpec:
    """--early-stop METRIC:PATIENCE[:MODE[:MIN_DELTA]] as an EarlyStopSpec (ConfigError, one line,
    when malformed)."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"--early-stop must be {EARLY_STOP_FORM}, got {text!r}: {why}")

    parts = _split(text, 2, 4, bad)
    metric, patience_text = parts[0], parts[1]
    try:
        patience = int(patience_text)
    except ValueError:
        raise bad(f"PATIENCE must be an integer >= 1 (evaluations), not {patience_text!r}") from None
    if patience < 1:
        raise bad(f"PATIENCE must be an integer >= 1 (evaluations), not {patience}")
    mode = _mode(metric, parts[2] if len(parts) > 2 else "auto", bad)
    min_delta = 0.0
    if len(parts) > 3:
        try:
            min_delta = float(parts[3])
        except ValueError:
            raise bad(f"MIN_DELTA must be a number >= 0, not {parts[3]!r}") from None
        if not math.isfinite(min_delta) or min_delta < 0:
            raise bad(f"MIN_DELTA must be a finite number >= 0, not {parts[3]!r}")
    return EarlyStopSpec(metric, patience, mode, min_delta)


def parse_keep_best(text: str) -> KeepBestSpec:
    """--keep-best METRIC[:MODE] as a KeepBestSpec (ConfigError, one line, when malformed)."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"--keep-best must be {KEEP_BEST_FORM}, got {text!r}: {why}")

    parts = _split(text, 1, 2, bad)
    return KeepBestSpec(parts[0], _mode(parts[0], parts[1] if len(parts) > 1 else "auto", bad))


def _split(text: object, least: int, most: int, bad: Callable[[str], ConfigError]) -> list[str]:
    """`text`'s colon-separated fields, stripped, checked for their number and a usable METRIC."""
    if not isinstance(text, str):
        raise bad("expected a string")
    parts = [part.strip() for part in text.split(":")]
    if not least <= len(parts) <= most:
        raise bad(f"{len(parts)} colon-separated field{'s' if len(parts) != 1 else ''}, expected {least} to {most}")
    if not parts[0]:
        raise bad("METRIC is empty")
    if any(ch.isspace() for ch in parts[0]):
        raise bad(f"METRIC {parts[0]!r} holds a space")  # no evaluation field has one: surely a typo
    return parts


def _mode(metric: str, mode: str, bad: Callable[[str], ConfigError]) -> str:
    if mode.lower() not in MODES:
        raise bad(f"MODE must be one of {', '.join(MODES)}, not {mode!r}")
    return resolve_mode(metric, mode)
