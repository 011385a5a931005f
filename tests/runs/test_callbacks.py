"""The built-in training callbacks and their dispatcher (pgc_mpi.runs.callbacks), and the specs of
--early-stop and --keep-best (pgc_mpi.config.callback_specs)."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from pgc_mpi.config.callback_specs import (
    EarlyStopSpec,
    KeepBestSpec,
    parse_early_stop,
    parse_keep_best,
    resolve_mode,
)
from pgc_mpi.errors import ConfigError, PgcError
from pgc_mpi.runs.callbacks import (
    BestCheckpoint,
    Callbacks,
    CSVLogger,
    EarlyStopping,
    TensorBoardLogger,
    callbacks_from_config,
)


class FakeRun:
    """What the master passes to on_start: it records the checkpoints asked for."""

    def __init__(self, out: Path, resumed_at: int | None = None):
        self.out, self.resumed_at, self.saved = out, resumed_at, []

    def save_checkpoint(self, name: str) -> Path:
        self.saved.append(name)
        return self.out / "checkpoints" / f"{name}.h5"


def evals(metric: str, values: list[float]) -> list[dict]:
    return [{"step": 10 * (i + 1) - 1, "train_loss": 1.0, metric: v} for i, v in enumerate(values)]


# --- specs -------------------------------------------------------------------------------------

def test_specs_parse_with_their_defaults_and_resolve_auto():
    assert parse_early_stop("test_accuracy:5") == EarlyStopSpec("test_accuracy", 5, "max", 0.0)
    assert parse_early_stop("train_loss:3:min:0.001") == EarlyStopSpec("train_loss", 3, "min", 0.001)
    assert parse_early_stop(" test_loss : 2 : AUTO ") == EarlyStopSpec("test_loss", 2, "min", 0.0)
    assert parse_early_stop("my_score:1:max") == EarlyStopSpec("my_score", 1, "max", 0.0)
    assert parse_keep_best("test_accuracy") == KeepBestSpec("test_accuracy", "max")
    assert parse_keep_best("test_loss:min") == KeepBestSpec("test_loss", "min")
    assert resolve_mode("top5_accuracy", "auto") == "max" and resolve_mode("test_loss", "auto") == "min"
    assert resolve_mode("test_accuracy", "min") == "min"


@pytest.mark.parametrize(("text", "why"), [
    ("test_accuracy", "expected 2 to 4"),
    ("test_accuracy:5:max:0.1:x", "expected 2 to 4"),
    (":5", "METRIC is empty"),
    ("test loss:5", "holds a space"),
    ("test_accuracy:five", "PATIENCE must be an integer >= 1 (evaluations), not 'five'"),
    ("test_accuracy:0", "PATIENCE must be an integer >= 1 (evaluations), not 0"),
    ("test_accuracy:2.5", "PATIENCE must be an integer"),
    ("test_accuracy:5:up", "MODE must be one of min, max, auto, not 'up'"),
    ("test_accuracy:5:max:-0.1", "MIN_DELTA must be a finite number >= 0"),
    ("test_accuracy:5:max:nan", "MIN_DELTA must be a finite number >= 0"),
    ("test_accuracy:5:max:tiny", "MIN_DELTA must be a number >= 0, not 'tiny'"),
])
def test_bad_early_stop_specs_say_the_option_the_value_and_the_form(text, why):
    with pytest.raises(ConfigError) as err:
        parse_early_stop(text)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"--early-stop must be METRIC:PATIENCE[:MODE[:MIN_DELTA]] (e.g. "
                              f"test_accuracy:5 or train_loss:3:min:0.001), got {text!r}: ")
    assert why in message


@pytest.mark.parametrize(("text", "why"), [
    ("test_loss:min:x", "expected 1 to 2"), ("", "METRIC is empty"), ("test_loss:lowest", "MODE must be one of"),
])
def test_bad_keep_best_specs_say_the_option_the_value_and_the_form(text, why):
    with pytest.raises(ConfigError, match=r"^--keep-best must be METRIC\[:MODE\] .*, got ") as err:
        parse_keep_best(text)
    assert why in str(err.value) and repr(text) in str(err.value)


def test_resolve_mode_refuses_another_mode():
    with pytest.raises(ConfigError, match="'best' for metric 'test_loss' is not one of: min, max, auto"):
        resolve_mode("test_loss", "best")


# --- EarlyStopping -----------------------------------------------------------------------------

def _stop_step(stopper: EarlyStopping, records: list[dict], round_trip_at: int | None = None) -> int | None:
    """The step at which `stopper` asks to stop, the records fed one by one; with `round_trip_at`,
    its state goes through JSON into a new EarlyStopping after that many records (a resume)."""
    for i, record in enumerate(records):
        if i == round_trip_at:
            state = json.loads(json.dumps(stopper.state_dict()))
            stopper = EarlyStopping(stopper.metric, stopper.patience, stopper.mode, stopper.min_delta)
            stopper.load_state_dict(state)
        if stopper.on_eval(record):
            assert stopper.stopped_at == record["step"]
            return record["step"]
    assert stopper.stopped_at is None
    return None


def test_early_stopping_in_min_mode_counts_evaluations_without_improvement():
    records = evals("test_loss", [1.0, 0.8, 0.9, 0.7, 0.75, 0.72, 0.71])
    assert _stop_step(EarlyStopping("test_loss", 3), records) == 69  # 0.75, 0.72, 0.71 do not beat 0.7
    assert _stop_step(EarlyStopping("test_loss", 4), records) is None


def test_early_stopping_in_max_mode_for_an_accuracy_by_default():
    records = evals("test_accuracy", [0.5, 0.6, 0.55, 0.61, 0.6, 0.6])
    assert EarlyStopping("test_accuracy", 2).mode == "max"
    assert _stop_step(EarlyStopping("test_accuracy", 2), records) == 59
    assert _stop_step(EarlyStopping("test_accuracy", 2, mode="min"), records) == 29  # as if lower were better


def test_min_delta_needs_improvements_larger_than_it_and_small_ones_add_up():
    records = evals("test_loss", [1.0, 0.95, 0.91, 0.89, 0.7])
    # 0.95 and 0.91 are within 0.1 of 1.0: two stalls; 0.89 beats 1.0 by 0.11 and resets the count
    assert _stop_step(EarlyStopping("test_loss", 3, min_delta=0.1), records) is None
    assert _stop_step(EarlyStopping("test_loss", 2, min_delta=0.1), records) == 29
    assert _stop_step(EarlyStopping("test_loss", 2, min_delta=0.0), records) is None


def test_nan_is_no_improvement():
    records = evals("test_loss", [float("nan"), 1.0, float("nan"), float("nan")])
    assert _stop_step(EarlyStopping("test_loss", 2), records) == 39


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("at", range(8))
def test_early_stopping_stops_at_the_same_evaluation_across_a_resume(mode, at):
    records = evals("m", [0.5, 0.4, 0.45, 0.6, 0.3, 0.31, 0.62, 0.61, 0.2, 0.65, 0.64])
    expected = _stop_step(EarlyStopping("m", 2, mode, 0.01), records)
    assert expected is not None
    assert _stop_step(EarlyStopping("m", 2, mode, 0.01), records, round_trip_at=at) == expected


def test_early_stopping_state_of_another_metric_is_not_loaded(caplog):
    stopper = EarlyStopping("test_loss", 2)
    stopper.on_eval({"step": 0, "test_loss": 1.0})
    other = EarlyStopping("test_accuracy", 2)
    with caplog.at_level(logging.WARNING, logger="pgc_mpi"):
        other.load_state_dict(stopper.state_dict())
    assert other.best is None and other.bad == 0
    assert "tracks test_loss (min), this run's test_accuracy (max): it starts afresh" in caplog.text


def test_a_record_without_the_metric_names_it_and_the_keys_present():
    with pytest.raises(ConfigError) as err:
        EarlyStopping("test_acc", 2).on_eval({"step": 19, "train_loss": 0.41, "test_accuracy": 0.87})
    assert str(err.value) == ("--early-stop test_acc: the evaluation record of step 19 has no 'test_acc'; "
                              "it has: step, train_loss, test_accuracy")


def test_early_stopping_arguments_are_checked():
    with pytest.raises(ConfigError, match="patience must be an integer >= 1"):
        EarlyStopping("test_loss", 0)
    with pytest.raises(ConfigError, match="min_delta must be a finite number >= 0"):
        EarlyStopping("test_loss", 1, min_delta=-1)
    with pytest.raises(ConfigError, match="mode 'up'"):
        EarlyStopping("test_loss", 1, mode="up")


# --- BestCheckpoint ----------------------------------------------------------------------------

def test_best_checkpoint_saves_only_on_improvements(tmp_path):
    best, run = BestCheckpoint("test_accuracy"), FakeRun(tmp_path)
    best.on_start(run)
    saved_at = []
    for record in evals("test_accuracy", [0.5, 0.6, 0.6, 0.55, 0.7, 0.69]):
        before = len(run.saved)
        best.on_eval(record)
        if len(run.saved) > before:
            saved_at.append(record["step"])
    assert saved_at == [9, 19, 49] and run.saved == ["best"] * 3
    assert (best.best, best.step, best.path) == (0.7, 49, tmp_path / "checkpoints" / "best.h5")


def test_best_checkpoint_state_survives_a_resume(tmp_path):
    best, run = BestCheckpoint("test_loss"), FakeRun(tmp_path)
    best.on_start(run)
    best.on_eval({"step": 9, "test_loss": 0.3})
    state = json.loads(json.dumps(best.state_dict()))
    assert state == {"metric": "test_loss", "mode": "min", "best": 0.3, "step": 9}
    resumed, run2 = BestCheckpoint("test_loss", "min"), FakeRun(tmp_path, resumed_at=10)
    resumed.load_state_dict(state)
    resumed.on_start(run2)
    resumed.on_eval({"step": 19, "test_loss": 0.4})  # worse than before the resume: not saved
    assert run2.saved == []
    resumed.on_eval({"step": 29, "test_loss": 0.2})
    assert run2.saved == ["best"] and resumed.step == 29


def test_best_checkpoint_saves_the_state_of_this_evaluation(tmp_path):
    """The "best" checkpoint holds the callbacks' state: when it is written, the callback already
    knows that this evaluation is the best."""
    best = BestCheckpoint("test_loss")
    seen = []

    class Run(FakeRun):
        def save_checkpoint(self, name):
            seen.append(best.state_dict())
            return super().save_checkpoint(name)

    best.on_start(Run(tmp_path))
    best.on_eval({"step": 9, "test_loss": 0.3})
    assert seen == [{"metric": "test_loss", "mode": "min", "best": 0.3, "step": 9}]


# --- CSVLogger ---------------------------------------------------------------------------------

def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as fh:
        return list(csv.reader(fh))


def test_csv_logger_writes_the_first_records_columns_and_flushes_each_row(tmp_path):
    path = tmp_path / "sub" / "evals.csv"
    logger = CSVLogger(path)
    logger.on_start(FakeRun(tmp_path))
    logger.on_eval({"step": 9, "train_loss": 0.5, "test_loss": 0.6})
    assert _rows(path) == [["step", "train_loss", "test_loss"], ["9", "0.5", "0.6"]]  # flushed, still open
    logger.on_eval({"step": 19, "test_loss": 0.4, "new_metric": 1})
    logger.on_end({})
    assert _rows(path)[2] == ["19", "", "0.4"]


def test_csv_logger_appends_after_a_resume_and_drops_the_rows_from_the_resume_on(tmp_path):
    path = tmp_path / "evals.csv"
    first = CSVLogger(path)
    first.on_start(FakeRun(tmp_path))
    for step in (9, 19, 29):
        first.on_eval({"step": step, "test_loss": step / 100})
    first.on_end({})
    resumed = CSVLogger(path)
    resumed.on_start(FakeRun(tmp_path, resumed_at=20))  # the evaluation of step 29 is done again
    resumed.on_eval({"step": 29, "test_loss": 0.25})
    resumed.on_end({})
    assert _rows(path) == [["step", "test_loss"], ["9", "0.09"], ["19", "0.19"], ["29", "0.25"]]


def test_csv_logger_starts_anew_for_a_fresh_run_or_another_header(tmp_path):
    path = tmp_path / "evals.csv"
    path.write_text("step,test_loss\n9,0.5\n")
    fresh = CSVLogger(path)
    fresh.on_start(FakeRun(tmp_path))
    fresh.on_eval({"step": 9, "test_loss": 0.4})
    fresh.on_end({})
    assert _rows(path) == [["step", "test_loss"], ["9", "0.4"]]
    other = CSVLogger(path)
    other.on_start(FakeRun(tmp_path, resumed_at=5))
    other.on_eval({"step": 9, "test_accuracy": 0.9})
    other.on_end({})
    assert _rows(path) == [["step", "test_accuracy"], ["9", "0.9"]]


def test_csv_logger_without_on_start_appends_to_a_file_with_the_same_header(tmp_path):
    path = tmp_path / "evals.csv"
    path.write_text("step,test_loss\r\n9,0.5\r\n")
    logger = CSVLogger(path)
    logger.on_eval({"step": 19, "test_loss": 0.4})
    logger.on_end({})
    assert _rows(path) == [["step", "test_loss"], ["9", "0.5"], ["19", "0.4"]]


# --- TensorBoardLogger -------------------------------------------------------------------------

def test_tensorboard_logger_writes_scalars_tensorboard_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "tb"
    logger = TensorBoardLogger(logdir)
    logger.on_start(FakeRun(tmp_path))
    for step in range(3):
        logger.on_step({"step": step, "train_loss": 1.0 - step / 10, "lr": 0.1, "lr_groups": [0.1, 0.01],
                        "step_time": 0.5, "grad_norm": None, "scheme": "gc-cr", "arrivals": [1, 2]})
    logger.on_eval({"step": 2, "train_loss": 0.8, "test_accuracy": 0.75, "model": "mlp"})
    logger.on_end({})
    assert list(logdir.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(logdir))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted(["train_loss", "lr", "lr/0", "lr/1", "step_time",
                                                       "eval/train_loss", "eval/test_accuracy"])

    def points(tag):
        return [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)]

    assert points("train_loss") == [(0, 1.0), (1, 0.9), (2, 0.8)]
    assert points("lr/1") == [(0, 0.01), (1, 0.01), (2, 0.01)]
    assert points("eval/test_accuracy") == [(2, 0.75)]


def test_a_resumed_tensorboard_logger_hides_the_earlier_events_from_the_resume_on(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for resumed_at, steps, offset in ((None, range(6), 0.0), (3, range(3, 5), 10.0)):
        logger = TensorBoardLogger(tmp_path / "tb")
        logger.on_start(FakeRun(tmp_path, resumed_at))
        for step in steps:
            logger.on_step({"step": step, "train_loss": offset + step})
        logger.on_end({})
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train_loss")] == [(0, 0), (1, 1), (2, 2), (3, 13), (4, 14)]


def test_tensorboard_logger_without_the_package_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        TensorBoardLogger("tb")
    assert str(err.value) == "TensorBoardLogger needs the tensorboard package: pip install 'pgc-mpi[tensorboard]'"


# --- the dispatcher ----------------------------------------------------------------------------

class Recorder:
    def __init__(self, stop_at=None):
        self.calls, self.stop_at, self.n = [], stop_at, 0

    def on_step(self, record):
        self.calls.append(("step", record["step"]))
        return record["step"] == self.stop_at

    def on_eval(self, record):
        self.calls.append(("eval", record["step"]))

    def state_dict(self):
        return {"n": len(self.calls)}

    def load_state_dict(self, state):
        self.n = state["n"]


class OnlyEnd:
    def __init__(self):
        self.summary = None

    def on_end(self, summary):
        self.summary = summary


def test_every_callback_is_called_and_any_one_stops_the_run():
    a, b, c = Recorder(stop_at=2), OnlyEnd(), Recorder()
    callbacks = Callbacks([a, b, c])
    assert [callbacks.step({"step": t}) for t in range(3)] == [False, False, True]
    assert callbacks.stopped_by == ["Recorder"]
    assert c.calls == [("step", 0), ("step", 1), ("step", 2)]  # called after a asked to stop
    assert callbacks.eval({"step": 2}) is False and callbacks.stopped_by == []
    callbacks.start(FakeRun(Path(".")))  # no callback has on_start: nothing happens
    callbacks.checkpoint(Path("ckpt.h5"))
    callbacks.end({"status": "stopped"})
    assert b.summary == {"status": "stopped"}


def test_the_dispatcher_stops_on_an_early_stopping_evaluation():
    callbacks = Callbacks([EarlyStopping("test_loss", 1), Recorder()])
    assert callbacks.eval({"step": 9, "test_loss": 1.0}) is False
    assert callbacks.eval({"step": 19, "test_loss": 1.0}) is True and callbacks.stopped_by == ["EarlyStopping"]


def test_state_is_keyed_by_place_and_class_and_mismatches_are_ignored(caplog):
    a, stopper = Recorder(), EarlyStopping("test_loss", 2)
    before = Callbacks([a, OnlyEnd(), stopper])
    before.step({"step": 0})
    before.eval({"step": 0, "test_loss": 0.5})
    state = json.loads(json.dumps(before.state_dict()))
    assert set(state) == {"0:Recorder", "2:EarlyStopping"}
    after_stopper, moved = EarlyStopping("test_loss", 2), Recorder()
    with caplog.at_level(logging.WARNING, logger="pgc_mpi"):
        Callbacks([moved, OnlyEnd(), OnlyEnd(), after_stopper]).load_state_dict(state)
    assert moved.n == 2 and after_stopper.best is None  # EarlyStopping moved to another place: afresh
    assert "callback 2:EarlyStopping, which this run does not have at that place: ignored" in caplog.text
    assert "no state for callback 3:EarlyStopping: it starts afresh" in caplog.text
    same = EarlyStopping("test_loss", 2)
    Callbacks([Recorder(), OnlyEnd(), same]).load_state_dict(state)
    assert same.best == 0.5
    Callbacks([Recorder()]).load_state_dict(None)  # a checkpoint without callback state


def test_a_failing_callback_is_named_with_its_hook():
    class Broken:
        def on_eval(self, record):
            raise ZeroDivisionError("division by zero")

    with pytest.raises(RuntimeError, match=r"^callback Broken.on_eval raised ZeroDivisionError: division by zero$"):
        Callbacks([Broken()]).eval({"step": 0})
    with pytest.raises(ConfigError, match=r"^callback EarlyStopping.on_eval: --early-stop test_accuracy: the "):
        Callbacks([EarlyStopping("test_accuracy", 1)]).eval({"step": 0, "test_loss": 0.1})

    class Full:
        def on_eval(self, record):
            raise OSError(28, "No space left on device")

    with pytest.raises(PgcError, match=r"^callback Full.on_eval: \[Errno 28\] No space left on device$"):
        Callbacks([Full()]).eval({"step": 0})


# --- from a configuration ----------------------------------------------------------------------

def test_callbacks_from_config_builds_what_is_asked_in_order(tmp_path):
    assert callbacks_from_config(SimpleNamespace()) == []
    assert callbacks_from_config(SimpleNamespace(early_stop=None, keep_best=None, csv_log=None, tensorboard=None)) == []
    cfg = SimpleNamespace(early_stop="test_loss:3:min:0.01", keep_best="test_accuracy", csv_log=str(tmp_path / "e.csv"))
    stopper, best, logger = callbacks_from_config(cfg)
    assert (type(stopper), stopper.metric, stopper.patience, stopper.mode, stopper.min_delta) == (
        EarlyStopping, "test_loss", 3, "min", 0.01)
    assert (type(best), best.metric, best.mode) == (BestCheckpoint, "test_accuracy", "max")
    assert isinstance(logger, CSVLogger) and logger.path == tmp_path / "e.csv"
    spec = callbacks_from_config(SimpleNamespace(early_stop=EarlyStopSpec("test_loss", 2, "min")))[0]
    assert spec.patience == 2
    with pytest.raises(ConfigError, match="^--early-stop must be"):
        callbacks_from_config(SimpleNamespace(early_stop="test_loss"))
    pytest.importorskip("tensorboard")
    (tb,) = callbacks_from_config(SimpleNamespace(tensorboard=str(tmp_path / "tb")))
    assert isinstance(tb, TensorBoardLogger) and not (tmp_path / "tb").exists()  # nothing written yet
