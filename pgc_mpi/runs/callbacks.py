"""Training callbacks: code that rank 0 (the master) runs at fixed points of a run.

The protocol. A callback is any object with any of these methods (a missing one is skipped):

    on_start(run)          once, before the first step (also after a resume); `run` has
                           `out` (Path: the run folder), `resumed_at` (the step a resumed run goes
                           on from, or None) and `save_checkpoint(name: str) -> Path` (writes a full
                           checkpoint of the current state as `name` in the run's checkpoints
                           folder and returns its path): see RunHandle
    on_step(record)        after each step, with its step record (metrics.jsonl's fields:
                           "step", "train_loss", "step_time", ...)
    on_eval(record)        after each evaluation, with its record: {"step": 19, "train_loss": 0.41,
                           "test_loss": 0.45, "test_accuracy": 0.87, ...}
    on_checkpoint(path)    after each checkpoint was written
    on_end(summary)        once, when the run ends (also when a callback stopped it)

and optionally `state_dict() -> dict` (JSON-able) and `load_state_dict(dict)` for the state that
must survive a resume (it is stored in the checkpoint). An on_step or on_eval that returns a true
value asks to stop the run after that step; the others' results are ignored.

`Callbacks` calls a list of them in order. Its decisions:
- every callback is called at every hook, also after one of them asked to stop (a logger still
  writes the evaluation that stopped the run);
- a callback that raises stops the run with an error naming the callback's class and the hook:
  a ConfigError stays a ConfigError (a setting to change, e.g. --early-stop naming a metric the
  evaluations lack), any other PgcError or an OSError (a full disk) becomes a PgcError (one line
  is the whole story), anything else a RuntimeError chained to it (a bug: its traceback is kept);
- its state is keyed "<index>:<class name>", and a resume loads each entry only into the callback
  at the same index of the same class; an entry that matches no callback (the list changed
  between the two starts) is ignored, and a callback without an entry starts afresh, each with a
  warning: changing the callbacks is a legitimate part of a resume (adding --csv-log), and the
  checkpoint's training state is unaffected by them. The built-ins likewise start afresh, with a
  warning, when their state tracked another metric or mode.

Built-ins: EarlyStopping (--early-stop), BestCheckpoint (--keep-best), CSVLogger (--csv-log) and
TensorBoardLogger (--tensorboard); `callbacks_from_config` builds the ones a configuration asks for.
"""

from __future__ import annotations

import csv
import importlib.util
import logging
import math
import numbers
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from ..config.callback_specs import EarlyStopSpec, KeepBestSpec, parse_early_stop, parse_keep_best, resolve_mode
from ..errors import ConfigError, PgcError

HOOKS = ("on_start", "on_step", "on_eval", "on_checkpoint", "on_end")
STEP_SCALARS = ("train_loss", "lr", "grad_norm", "step_time")  # what TensorBoardLogger plots per step
log = logging.getLogger("pgc_mpi")


class RunHandle(Protocol):
    """What on_start receives: the run, as the master exposes it to callbacks."""

    out: Path
    resumed_at: int | None

    def save_checkpoint(self, name: str) -> Path:
        """Write a full checkpoint of the current state as `name`; its path."""
        ...


class Callbacks:
    """The dispatcher: calls each hook of every callback, in the list's order (see the module's
    docstring for its rules on errors and state)."""

    def __init__(self, callbacks: Iterable[object] = ()):
        self.callbacks = list(callbacks)
        self.stopped_by: list[str] = []  # the class names of the callbacks that asked to stop

    def start(self, run: RunHandle) -> None:
        """on_start(run) of each callback."""
        self._call("on_start", run)

    def step(self, record: dict[str, Any]) -> bool:
        """on_step(record) of each callback; True if any asked to stop the run."""
        return self._call("on_step", record)

    def eval(self, record: dict[str, Any]) -> bool:
        """on_eval(record) of each callback; True if any asked to stop the run."""
        return self._call("on_eval", record)

    def checkpoint(self, path: Path) -> None:
        """on_checkpoint(path) of each callback."""
        self._call("on_checkpoint", path)

    def end(self, summary: dict[str, Any]) -> None:
        """on_end(summary) of each callback."""
        self._call("on_end", summary)

    def state_dict(self) -> dict[str, Any]:
        """{"<index>:<class name>": that callback's state_dict()} for those that have one."""
        return {_key(i, cb): self._invoke(cb, "state_dict") for i, cb in enumerate(self.callbacks)
                if callable(getattr(cb, "state_dict", None))}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Give each callback its entry of `state` (a checkpoint's state_dict(); None: a checkpoint
        without callback state). Mismatched entries are ignored with a warning (module docstring)."""
        if state is None:
            state = {}
        if not isinstance(state, dict):
            raise PgcError(f"the checkpoint's callback state is a {type(state).__name__}, not a dict")
        wanted = {_key(i, cb): cb for i, cb in enumerate(self.callbacks)
                  if callable(getattr(cb, "load_state_dict", None))}
        for key in sorted(set(state) - set(wanted)):
            log.warning("resume: the checkpoint holds the state of callback %s, which this run does not have at "
                        "that place: ignored", key)
        for key, cb in wanted.items():
            if key in state:
                self._invoke(cb, "load_state_dict", state[key])
            else:
                log.warning("resume: the checkpoint holds no state for callback %s: it starts afresh", key)

    def _call(self, hook: str, *args: Any) -> bool:
        stop = False
        if hook in ("on_step", "on_eval"):
            self.stopped_by = []
        for cb in self.callbacks:
            if getattr(cb, hook, None) is None:
                continue
            if self._invoke(cb, hook, *args) and hook in ("on_step", "on_eval"):
                stop = True
                self.stopped_by.append(type(cb).__name__)
        return stop

    @staticmethod
    def _invoke(cb: object, hook: str, *args: Any) -> Any:
        try:
            return getattr(cb, hook)(*args)
        except Exception as exc:  # noqa: BLE001 - named and re-raised, never swallowed
            where = f"callback {type(cb).__name__}.{hook}"
            if isinstance(exc, ConfigError):
                raise ConfigError(f"{where}: {exc}") from exc
            if isinstance(exc, (PgcError, OSError)):
                raise PgcError(f"{where}: {exc}") from exc
            raise RuntimeError(f"{where} raised {type(exc).__name__}: {exc}") from exc


def _key(index: int, cb: object) -> str:
    return f"{index}:{type(cb).__name__}"


def metric_value(owner: str, metric: str, record: dict[str, Any]) -> float:
    """record[metric] as a float (NaN stays NaN); a ConfigError naming the metric and the keys the
    record has when it lacks it or it is no number."""
    if metric not in record:
        raise ConfigError(f"{owner}: the evaluation record of step {record.get('step')} has no {metric!r}; "
                          f"it has: {', '.join(map(str, record))}")
    value = record[metric]
    if not _is_number(value):
        raise ConfigError(f"{owner}: {metric!r} is {value!r} at step {record.get('step')}, not a number")
    return float(value)


def _step(record: dict[str, Any]) -> int | None:
    """The record's step as a plain int (a NumPy integer would not go into the JSON state)."""
    step = record.get("step")
    return None if step is None else int(step)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class _Tracker:
    """The best value so far of a metric, in min or max mode (what EarlyStopping and BestCheckpoint share)."""

    def __init__(self, metric: str, mode: str = "auto"):
        self.metric = metric
        self.mode = resolve_mode(metric, mode)
        self.best: float | None = None

    def better(self, value: float, margin: float = 0.0) -> bool:
        """Whether `value` beats the best by more than `margin` (NaN never does)."""
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        return value < self.best - margin if self.mode == "min" else value > self.best + margin

    def _matches(self, state: dict[str, Any]) -> bool:
        if state.get("metric") == self.metric and state.get("mode") == self.mode:
            return True
        log.warning("resume: %s's saved state tracks %s (%s), this run's %s (%s): it starts afresh",
                    type(self).__name__, state.get("metric"), state.get("mode"), self.metric, self.mode)
        return False


class EarlyStopping(_Tracker):
    """Stop the run when `metric` has not improved by more than `min_delta` for `patience`
    evaluations in a row (an improvement smaller than that does not move the best value, so a slow
    creep still counts as a stall until it adds up to min_delta)."""

    def __init__(self, metric: str, patience: int, mode: str = "auto", min_delta: float = 0.0):
        super().__init__(metric, mode)
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ConfigError(f"EarlyStopping: patience must be an integer >= 1 (evaluations), got {patience!r}")
        if not _is_number(min_delta) or not math.isfinite(min_delta) or min_delta < 0:
            raise ConfigError(f"EarlyStopping: min_delta must be a finite number >= 0, got {min_delta!r}")
        self.patience, self.min_delta = patience, float(min_delta)
        self.bad = 0  # evaluations in a row without an improvement
        self.stopped_at: int | None = None  # the step of the evaluation that stopped the run

    def on_eval(self, record: dict[str, Any]) -> bool:
        """Count this evaluation; True (stop) once `patience` in a row did not improve."""
        value = metric_value(f"--early-stop {self.metric}", self.metric, record)
        if self.better(value, self.min_delta):
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        if self.bad >= self.patience and self.stopped_at is None:
            self.stopped_at = _step(record)
        return self.stopped_at is not None

    def state_dict(self) -> dict[str, Any]:
        """The best value, the count of bad evaluations, and what they track (to check on resume)."""
        return {"metric": self.metric, "mode": self.mode, "best": self.best, "bad": self.bad,
                "stopped_at": self.stopped_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from `state` (a state_dict()), unless it tracked another metric or mode."""
        if self._matches(state):
            best = state.get("best")
            self.best = None if best is None else float(best)
            self.bad = int(state.get("bad", 0))
            self.stopped_at = state.get("stopped_at")


class BestCheckpoint(_Tracker):
    """Keep a checkpoint named "best" of the evaluation with the best `metric` so far: saved
    through run.save_checkpoint("best") at each evaluation that improves it (any improvement)."""

    def __init__(self, metric: str, mode: str = "auto"):
        super().__init__(metric, mode)
        self.run: RunHandle | None = None
        self.step: int | None = None  # the step of the best evaluation
        self.path: Path | None = None  # the last "best" checkpoint written by this start

    def on_start(self, run: RunHandle) -> None:
        """Keep the run, to checkpoint it."""
        self.run = run

    def on_eval(self, record: dict[str, Any]) -> None:
        """Checkpoint the run if this evaluation's metric is the best so far."""
        value = metric_value(f"--keep-best {self.metric}", self.metric, record)
        if not self.better(value):
            return
        if self.run is None:
            raise PgcError("BestCheckpoint.on_eval before on_start: it has no run to checkpoint")
        # remember first: the checkpoint holds the callbacks' state, and resuming from it must
        # know that this evaluation is the best
        self.best, self.step = value, _step(record)
        self.path = self.run.save_checkpoint("best")

    def state_dict(self) -> dict[str, Any]:
        """The best value and its step, and what they track (to check on resume)."""
        return {"metric": self.metric, "mode": self.mode, "best": self.best, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from `state` (a state_dict()), unless it tracked another metric or mode."""
        if self._matches(state):
            best = state.get("best")
            self.best = None if best is None else float(best)
            self.step = state.get("step")


class CSVLogger:
    """One CSV row per evaluation record, flushed as written. Its columns are the keys of the
    first evaluation record, in order (keys that appear later are left out, missing ones empty).

    The file is appended to when it exists with that same header and the run is resumed, or on_start
    was never called (a standalone use): after a resume only the rows of the steps before it are
    kept, so that no evaluation appears twice (as in metrics.jsonl). Otherwise, a fresh run or
    another header, the file is written anew."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.columns: list[str] | None = None
        self._fh = None
        self._writer: csv.DictWriter | None = None
        self._fresh = False  # on_start told a run that starts at step 0
        self._resumed_at: int | None = None

    def on_start(self, run: RunHandle) -> None:
        """Note whether the run is resumed: a fresh run's file starts anew."""
        self._resumed_at = run.resumed_at
        self._fresh = run.resumed_at is None

    def on_eval(self, record: dict[str, Any]) -> None:
        """Write this record's row (the first one opens the file, see the class docstring)."""
        if self._writer is None:
            self._open(list(map(str, record)))
        self._writer.writerow(record)  # None is written as an empty field
        self._fh.flush()

    def on_end(self, summary: dict[str, Any]) -> None:
        """Close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = self._writer = None

    def _open(self, columns: list[str]) -> None:
        self.columns = columns
        kept = None if self._fresh else self._rows_to_keep(columns)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if kept is not None and self._resumed_at is not None:
            # rewrite through a temporary file: a crash now must not lose the earlier rows
            tmp = self.path.with_name(self.path.name + ".tmp")
            with tmp.open("w", newline="") as fh:
                csv.writer(fh).writerows([columns, *kept])
            os.replace(tmp, self.path)
        self._fh = self.path.open("a" if kept is not None else "w", newline="")
        self._writer = csv.DictWriter(self._fh, columns, restval="", extrasaction="ignore")
        if kept is None:
            self._writer.writeheader()
            self._fh.flush()

    def _rows_to_keep(self, columns: list[str]) -> list[list[str]] | None:
        """The existing file's rows to keep (all, or those before the resume step), or None when
        it is absent or has another header."""
        if not self.path.is_file():
            return None
        with self.path.open(newline="") as fh:
            rows = list(csv.reader(fh))
        if not rows or rows[0] != columns:
            return None
        if self._resumed_at is None or "step" not in columns:
            return rows[1:]
        at = columns.index("step")
        return [row for row in rows[1:] if len(row) > at and _int_or_none(row[at]) is not None
                and _int_or_none(row[at]) < self._resumed_at]


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


class TensorBoardLogger:
    """TensorBoard scalars in `log_dir`, through torch.utils.tensorboard's SummaryWriter (local
    files only). Per step: train_loss, lr (and lr/<group index> for a record's "lr_groups"),
    grad_norm and step_time, where the record has them as numbers; per evaluation: every numeric
    field but "step", as eval/<name>. A resumed run purges the events of the steps from the resume on."""

    def __init__(self, log_dir: str | os.PathLike[str]):
        # checked here, not at the first write: a missing package must stop the run before it trains
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError(_NO_TENSORBOARD)
        self.log_dir = Path(log_dir)
        self._writer = None

    def on_start(self, run: RunHandle) -> None:
        """Open the writer; after a resume, TensorBoard hides the earlier start's events from that step on."""
        self._open(run.resumed_at)

    def on_step(self, record: dict[str, Any]) -> None:
        """The step's scalars at global step record["step"]."""
        step = record["step"]
        scalars = {name: record[name] for name in STEP_SCALARS if _is_number(record.get(name))}
        groups = record.get("lr_groups")
        if isinstance(groups, (list, tuple)):
            scalars.update({f"lr/{i}": lr for i, lr in enumerate(groups) if _is_number(lr)})
        writer = self._open()
        for name, value in scalars.items():
            writer.add_scalar(name, float(value), step)

    def on_eval(self, record: dict[str, Any]) -> None:
        """Every numeric field of the evaluation but "step", as eval/<name>; then flush."""
        writer = self._open()
        for name, value in record.items():
            if name != "step" and _is_number(value):
                writer.add_scalar(f"eval/{name}", float(value), record["step"])
        writer.flush()

    def on_checkpoint(self, path: Path) -> None:
        """Flush, so that the events on disk reach as far as the checkpoint."""
        if self._writer is not None:
            self._writer.flush()

    def on_end(self, summary: dict[str, Any]) -> None:
        """Close the writer."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _open(self, purge_step: int | None = None):
        if self._writer is None:
            try:  # lazily: torch is loaded only where TensorBoard is used
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ConfigError(_NO_TENSORBOARD) from exc
            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)
        return self._writer


_NO_TENSORBOARD = "TensorBoardLogger needs the tensorboard package: pip install 'pgc-mpi[tensorboard]'"


def callbacks_from_config(cfg: object) -> list[object]:
    """The built-in callbacks `cfg` asks for, from its attributes early_stop (a spec string or an
    EarlyStopSpec), keep_best (a string or a KeepBestSpec), csv_log (a file) and tensorboard (a
    folder); absent or None: not wanted. In that order: EarlyStopping comes before BestCheckpoint
    so that the "best" checkpoint holds its state after the evaluation that checkpointed."""
    found: list[object] = []
    early = getattr(cfg, "early_stop", None)
    if early is not None:
        spec = early if isinstance(early, EarlyStopSpec) else parse_early_stop(early)
        found.append(EarlyStopping(spec.metric, spec.patience, spec.mode, spec.min_delta))
    best = getattr(cfg, "keep_best", None)
    if best is not None:
        spec_best = best if isinstance(best, KeepBestSpec) else parse_keep_best(best)
        found.append(BestCheckpoint(spec_best.metric, spec_best.mode))
    if getattr(cfg, "csv_log", None) is not None:
        found.append(CSVLogger(cfg.csv_log))
    if getattr(cfg, "tensorboard", None) is not None:
        found.append(TensorBoardLogger(cfg.tensorboard))
    return found
