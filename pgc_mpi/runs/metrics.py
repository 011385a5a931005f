"""Run outputs: config.json, metrics.jsonl (flushed line by line), rank-aware logging, progress."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import socket
import sys
import time
import warnings
import zlib
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ..errors import ConfigError, RunDataError, WriteError, write_failure


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


# The records of the steps before a resume that a resumed run keeps (summaries and shutdowns are
# the earlier start's: a resumed run writes its own): steps, evaluations and lost workers.
KEPT_ON_RESUME = (None, "eval", "worker_lost")


class MetricsWriter:
    """metrics.jsonl: one JSON object per line, flushed as written so a killed job keeps it; the
    step records' per-message lists go to messages.bin beside it (pgc_mpi.runs.message_log), so that
    the JSON does not grow with the number of workers."""

    def __init__(self, out_dir: Path, keep_steps_before: int | None = None):
        """A new metrics.jsonl and messages.bin, or, when resuming at step `keep_steps_before`, the
        existing ones with only the records of earlier steps kept (no duplicated or missing steps
        after a resume)."""
        from .message_log import MessageLog

        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        kept: list[str] = []
        if keep_steps_before is not None and self.path.exists():
            # damaged lines (a crash's torn last line, a flipped byte) are dropped, never kept
            for _, rec in read_lines(self.path)[0]:
                step = rec.get("step", keep_steps_before)
                # a worker lost at the resume step was lost before the checkpoint of that step
                lost_then = step == keep_steps_before and rec.get("event") == "worker_lost"
                if rec.get("event") in KEPT_ON_RESUME and (step < keep_steps_before or lost_then):
                    kept.append(json_line(rec))  # with its CRC, whether or not the old line had one
        with self.path.open("w") as fh:
            fh.writelines(kept)
        # appends from here on: a failing rank may append its "failed" summary at any time
        # (train._record_failure), and an append never overwrites another's line
        self._fh: TextIO = self.path.open("a", buffering=1)
        self._messages = MessageLog(out_dir, keep_steps_before)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record and flush it (a full disk: one WriteError naming the file); a step
        record's per-message lists go to messages.bin first. Every record carries "time" (see
        json_line)."""
        try:
            self._fh.write(json_line(self._messages.write(record)))
            self._fh.flush()
        except OSError as exc:
            raise WriteError(write_failure(self.path, exc)) from None

    def close(self) -> None:
        self._fh.close()
        self._messages.close()


# The parts of the master's own work in a step, recorded as `<part>_time` seconds in every step record:
# receive (judging and taking in the arrived messages: header, finiteness, the collector's offer,
# which accumulates for the streaming schemes), decode, update (the optimizer step, and pbs's
# diagnostics), send (copying the step's model into a send buffer and starting its sends).
MASTER_PARTS = ("receive", "decode", "update", "send")


def master_times(seconds: dict[str, float] | None = None) -> dict[str, float]:
    """The `<part>_time` fields of a step record: `seconds` per part, or zeros (the simulator's
    master and the ddp baseline's rank 0 take no time in a step)."""
    return {f"{part}_time": (seconds or {}).get(part, 0.0) for part in MASTER_PARTS}


# Every line of metrics.jsonl ends with the CRC-32 of the rest of the line: a flipped byte would
# otherwise often leave valid JSON with a wrong number in it (a digit flips to another digit).
# The field is the record's last key, `"crc32": "<8 hex digits>"`, so the line stays plain JSON
# for jq and friends; the CRC covers the line as it reads without it (`{...}`, ASCII).
CRC_KEY = "crc32"
_CRC_TAIL = re.compile(rb', "crc32": "([0-9a-f]{8})"\}\s*$')


def json_line(record: dict[str, Any]) -> str:
    """A metrics record as its line of metrics.jsonl, stamped with "time", when it was written
    (seconds since the epoch, UTC, to the millisecond), unless it has a "time" of its own, and
    ending with its CRC-32 (`CRC_KEY`; see read_metrics)."""
    if "time" not in record:
        record = {**record, "time": round(time.time(), 3)}
    body = json.dumps({k: v for k, v in _plain(record).items() if k != CRC_KEY})  # ASCII: ensure_ascii
    return f'{body[:-1]}, "{CRC_KEY}": "{zlib.crc32(body.encode()):08x}"}}\n'


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write a JSON file (for config.json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_plain(data), indent=2) + "\n")


def read_json(path: Path, what: str = "the run's configuration") -> dict[str, Any]:
    """A JSON object file (config.json) as a dict; RunDataError, one line naming the file and what
    to do, when it cannot be read or is damaged (not JSON, not an object)."""
    try:
        data = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise RunDataError(f"{path}: missing ({what}); give a run folder that holds it") from None
    except OSError as exc:
        raise RunDataError(f"{path}: cannot be read ({exc.strerror or exc}); check the file's permissions") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both
        raise RunDataError(f"{path}: damaged, not JSON ({str(exc).splitlines()[0]}); it holds {what}: restore it "
                           f"from a copy, or rerun") from None
    if not isinstance(data, dict):
        raise RunDataError(f"{path}: damaged, not a JSON object; it holds {what}: restore it from a copy, or rerun")
    return data


class DamagedLinesWarning(UserWarning):
    """A metrics.jsonl has lines that are damaged (their CRC or JSON fails): they were skipped."""


def parse_line(line: bytes, checked: bool) -> dict[str, Any] | None:
    """One line of metrics.jsonl as its record, or None when it is damaged: its CRC does not match,
    it is not a JSON object, or (`checked`: the file's lines carry CRCs) it has lost its CRC."""
    tail = _CRC_TAIL.search(line)
    if tail is not None:
        body = line[:tail.start()] + b"}"
        if zlib.crc32(body) != int(tail.group(1), 16):
            return None
    elif checked:
        return None
    else:  # written before lines carried a CRC: JSON is all there is to check
        body = line
    try:
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read_lines(path: Path) -> tuple[list[tuple[bytes, dict[str, Any]]], list[int]]:
    """(the (line, record) of every intact line, the 1-based numbers of the damaged ones) of a
    metrics.jsonl. The lines carry CRCs when any intact one does (a file written before they did
    is checked by its JSON only)."""
    lines = Path(path).read_bytes().split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()  # the newline that ends the last line
    checked = any(_CRC_TAIL.search(line) and parse_line(line, True) is not None for line in lines)
    intact, damaged = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = parse_line(line, checked)
        if record is None:
            damaged.append(number)
        else:
            intact.append((line, record))
    return intact, damaged


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All intact records of a metrics.jsonl, in order (without their CRC field). A damaged line (a
    flipped byte, a line cut short by a crash, garbage) is skipped with a DamagedLinesWarning that
    names the file, the lines and the steps now missing; it never raises for damage."""
    intact, damaged = read_lines(path)
    records = [{k: v for k, v in record.items() if k != CRC_KEY} for _, record in intact]
    if damaged:
        missing = _missing_steps(records)
        from .message_log import step_ranges

        lost = f"{step_ranges(missing)} missing" if missing else "no step record is missing"
        lines = f"line{'s' if len(damaged) > 1 else ''} {', '.join(map(str, damaged[:10]))}"
        warnings.warn(f"{path}: damaged, {lines}{', ...' if len(damaged) > 10 else ''} skipped: {lost}",
                      DamagedLinesWarning, stacklevel=2)
    return records


def _missing_steps(records: list[dict[str, Any]]) -> list[int]:
    """The steps from 0 (a run folder's records start there, a resume keeps the earlier ones) to the
    last one any record names (a step, an evaluation, a summary's count) with no step record."""
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    have = {r["step"] for r in records if "event" not in r and whole(r.get("step"))}
    named = [r["step"] for r in records if whole(r.get("step"))]
    named += [r["steps"] - 1 for r in records if r.get("event") == "summary" and whole(r.get("steps"))]
    return sorted(set(range(max(named, default=-1) + 1)) - have)


LOG_FORMAT = "%(asctime)s [rank {rank}] %(levelname)s %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def _formatter(rank: int) -> logging.Formatter:
    return logging.Formatter(LOG_FORMAT.format(rank=rank), LOG_DATE_FORMAT)


def setup_logging(rank: int, verbose: bool = False) -> logging.Logger:
    """The `pgc_mpi` logger with date, time and rank in every line, on standard error; INFO on rank 0,
    WARNING elsewhere (until configure_logging applies the run's --log-level)."""
    log = logging.getLogger("pgc_mpi")
    for handler in list(log.handlers):
        log.removeHandler(handler)
        if isinstance(handler, logging.FileHandler):
            handler.close()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(rank))
    log.addHandler(handler)
    log.setLevel(logging.INFO if rank == 0 or verbose else logging.WARNING)
    log.propagate = False
    return log


def log_file(log_dir: str | Path, rank: int) -> Path:
    """Where --log-dir DIR puts the log of `rank`."""
    return Path(log_dir) / f"rank-{rank}.log"


def make_log_dir(log_dir: str | Path | None) -> None:
    """Create --log-dir (and its parents); a ConfigError saying why when it cannot be."""
    if log_dir is None:
        return
    try:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"--log-dir {log_dir}: cannot create the directory: {reason}; "
                          f"give a directory this job may write to") from None


def configure_logging(rank: int, level: str = "info", log_dir: str | Path | None = None) -> logging.Logger:
    """The `pgc_mpi` logger for the run: `level` (debug, info, warning) on every rank, on standard
    error and, with `log_dir`, also in DIR/rank-<r>.log (appended to, so a resumed run keeps the
    earlier part). A file that cannot be opened is one warning; the log stays on standard error."""
    log = setup_logging(rank)
    log.setLevel(getattr(logging, level.upper()))
    if log_dir is not None:
        path = log_file(log_dir, rank)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(path, encoding="utf-8")
        except OSError as exc:
            log.warning("--log-dir: cannot write %s (%s); this rank logs to standard error only",
                        path, exc.strerror or exc)
        else:
            handler.setFormatter(_formatter(rank))
            log.addHandler(handler)
            # this start's first line in the file, whatever the level (not on standard error: noise there)
            handler.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, "log of rank %d: process %d on %s",
                                          (rank, os.getpid(), socket.gethostname()), None))
    return log


def _duration(seconds: float) -> str:
    """A time span for people: "45 s", "3 min 05 s", "2 h 04 min"; "?" when unknown."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """The run's progress on rank 0. On a terminal: one status line, redrawn in place (at most ten
    times a second). Otherwise (under mpiexec or srun, standard error is a pipe or a file): a log
    line every `interval` seconds of wall clock, and for the first and the last step.

    Each says the step, its training loss and time, the steps per second over the last interval,
    the estimated time left at that rate and the stragglers skipped so far."""

    REDRAW = 0.1  # seconds between two redraws of the terminal line

    def __init__(self, total: int, interval: float, log: logging.Logger, stream: TextIO = sys.stderr,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.interval, self.log, self.stream, self.clock = total, float(interval), log, stream, clock
        self.tty = _isatty(stream)
        self._shown = -math.inf  # when the last line was logged or drawn
        self._seen: deque[tuple[float, int]] = deque()  # (time, step) of the lines shown: the rate's window
        self._pending: tuple | None = None  # the latest update not shown yet (close() logs it)

    def update(self, step: int, loss: float, step_time: float, skipped: int) -> None:
        now = self.clock()
        last = step + 1 == self.total
        gap = self.REDRAW if self.tty else self.interval
        if now - self._shown < gap and not last and self._seen:
            self._pending = (now, step, loss, step_time, skipped)
            return
        self._show(now, step, loss, step_time, skipped)

    def _show(self, now: float, step: int, loss: float, step_time: float, skipped: int) -> None:
        text = self.text(now, step, loss, step_time, skipped)
        self._seen.append((now, step))
        self._shown, self._pending = now, None
        if self.tty:  # a line longer than the terminal would wrap, and "\r" would redraw only its end
            width = shutil.get_terminal_size().columns - 1
            self.stream.write("\r" + text[:width].ljust(width))
            self.stream.flush()
        else:
            self.log.info(text)

    def rate(self, now: float, step: int) -> float:
        """Steps per second over the last `interval` seconds or more (NaN before a second line: the
        first step's time, start-up included, says little about the rest)."""
        while len(self._seen) > 1 and now - self._seen[1][0] >= self.interval:
            self._seen.popleft()
        if self._seen and now > self._seen[0][0] and step > self._seen[0][1]:
            return (step - self._seen[0][1]) / (now - self._seen[0][0])
        return math.nan

    def text(self, now: float, step: int, loss: float, step_time: float, skipped: int) -> str:
        rate = self.rate(now, step)
        speed = ""
        if rate > 0:
            speed = f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"
            speed = f"{speed} steps/s  time left {_duration((self.total - step - 1) / rate)}  "
        return (f"step {step + 1}/{self.total}  loss {loss:.4f}  step {step_time * 1e3:.1f} ms  "
                f"{speed}stragglers skipped {skipped}")

    def close(self) -> None:
        """End the display: the last step shown (a run stopped early says where it stopped)."""
        if self._pending is not None:
            self._show(*self._pending)
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
