"""Run outputs: config.json, metrics.jsonl (flushed line by line), rank-aware logging, progress."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .errors import WriteError, write_failure


def _plain(value: Any) -> Any:
    """JSON-able form of NumPy scalars and arrays; non-finite floats become None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


class MetricsWriter:
    """metrics.jsonl: one JSON object per line, flushed as written so a killed job keeps it."""

    def __init__(self, out_dir: Path, keep_steps_before: int | None = None):
        """A new metrics.jsonl, or, when resuming at step `keep_steps_before`, the existing one with
        only the records of earlier steps kept (no duplicated or missing steps after a resume)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        kept: list[str] = []
        if keep_steps_before is not None and self.path.exists():
            with self.path.open() as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        break  # a line cut short by a crash: everything after it is lost anyway
                    if rec.get("event") in (None, "eval") and rec.get("step", keep_steps_before) < keep_steps_before:
                        kept.append(line if line.endswith("\n") else line + "\n")
        self._fh: TextIO = self.path.open("w", buffering=1)
        self._fh.writelines(kept)
        self._fh.flush()

    def write(self, record: dict[str, Any]) -> None:
        """Append one record and flush it (a full disk: one WriteError naming the file)."""
        try:
            self._fh.write(json.dumps(_plain(record)) + "\n")
            self._fh.flush()
        except OSError as exc:
            raise WriteError(write_failure(self.path, exc)) from None

    def close(self) -> None:
        self._fh.close()


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write a JSON file (for config.json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_plain(data), indent=2) + "\n")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl."""
    with Path(path).open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


def setup_logging(rank: int, verbose: bool = False) -> logging.Logger:
    """The `pgc_mpi` logger with the rank in every line; INFO on rank 0, WARNING elsewhere."""
    log = logging.getLogger("pgc_mpi")
    log.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO if rank == 0 or verbose else logging.WARNING)
    log.propagate = False
    return log


class Progress:
    """One updating status line on a terminal; a log line every `every` steps otherwise."""

    def __init__(self, total: int, every: int, log: logging.Logger, stream: TextIO = sys.stderr):
        self.total, self.every, self.log, self.stream = total, every, log, stream
        self.tty = stream.isatty()
        self._last = 0.0

    def update(self, step: int, loss: float, step_time: float, skipped: int) -> None:
        text = (f"step {step + 1}/{self.total}  loss {loss:.4f}  step {step_time * 1e3:.1f} ms  "
                f"stragglers skipped {skipped}")
        if self.tty:
            now = time.monotonic()
            if now - self._last > 0.1 or step + 1 == self.total:
                self.stream.write("\r" + text.ljust(78))
                self.stream.flush()
                self._last = now
        elif (step + 1) % self.every == 0 or step == 0:
            self.log.info(text)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class RepeatedWarnings:
    """Warnings that can repeat every step (a worker sending NaN, say): the first of each kind is
    logged, the rest counted, and `flush()` logs one line per kind with its count. A flood of
    identical lines hides the one that matters and slows the master down."""

    def __init__(self, log: logging.Logger):
        self.log = log
        self.counts: dict[tuple, int] = {}
        self._first: dict[tuple, str] = {}

    def warn(self, key: tuple, message: str) -> None:
        """Log `message` if it is the first of its `key`, else count it."""
        seen = self.counts.get(key, 0)
        self.counts[key] = seen + 1
        if not seen:
            self._first[key] = message
            self.log.warning("%s (repeats of this are counted and reported at the end)", message)

    def flush(self) -> None:
        """Log how often each warning repeated, then start counting afresh."""
        for key, count in self.counts.items():
            if count > 1:
                self.log.warning("%d more like this: %s", count - 1, self._first[key])
        self.counts.clear()
        self._first.clear()
