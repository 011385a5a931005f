"""What a user sees while a run goes on (issue 13): progress lines every --log-interval seconds under
mpiexec, evaluations in the log, --log-level on every rank, --log-dir, the learning-rate warning, and
the absolute "time" of every metrics record.

The mpiexec tests share two short jobs (a few seconds each); the rest runs in-process, without MPI.
"""

from __future__ import annotations

import io
import logging
import re
import time

import pytest

from pgc_mpi.config import config_from_args
from pgc_mpi.runs.metrics import MetricsWriter, Progress, _duration, configure_logging, read_metrics
from pgc_mpi.runtime.control import ControlSettings, RunControl

from helpers import events_of, run_train, steps_of

RANKS = 3  # the master and 2 workers
STEPS = 60
DATED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[rank (\d+)\] (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
PROGRESS = re.compile(rf"\[rank 0\] INFO step (\d+)/{STEPS}  loss \S+  step \S+ ms  ")


def _args(out, *extra: str) -> list[str]:
    # 60 steps of at least 20 ms of simulated compute: the run trains for a second or two
    return ["--scheme", "dgd", "-s", "0", "--steps", str(STEPS), "--compute-time", "0.02", "--eval-every", "20",
            "--out", str(out), *extra]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One run at the default level with --log-interval 0.2 and --log-dir: (process, out, logs, began, ended)."""
    base = tmp_path_factory.mktemp("logging")
    out, logs = base / "run", base / "logs"
    began = time.time()
    proc = run_train(RANKS, _args(out, "--log-interval", "0.2", "--log-dir", str(logs)), timeout=90)
    ended = time.time()
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out, logs, began, ended


def test_progress_lines_every_interval_under_mpiexec(default_run):
    """stderr is a pipe: dated log lines for the first step, every 0.2 s, and the last step; all but
    the first say the steps per second and the time left."""
    proc = default_run[0]
    lines = [line for line in proc.stderr.splitlines() if PROGRESS.search(line)]
    steps = [int(PROGRESS.search(line).group(1)) for line in lines]
    assert steps[0] == 1 and steps[-1] == STEPS, proc.stderr[-3000:]
    assert len(steps) >= 3 and steps == sorted(steps), proc.stderr[-3000:]
    assert all(DATED.match(line) for line in lines)
    for line in lines[1:]:
        assert re.search(r"  [\d.e+]+ steps/s  time left \d+ s  stragglers skipped \d+$", line), line
    assert "\r" not in proc.stderr  # no terminal display in a pipe


def test_evaluations_appear_in_the_log(default_run):
    proc, out = default_run[:2]
    evals = [line for line in proc.stderr.splitlines() if " eval: " in line]
    assert [int(re.search(r"step (\d+) eval", line).group(1)) for line in evals] == [20, 40, 60], proc.stderr
    assert re.search(r"\[rank 0\] INFO step 20 eval: train loss \d\.\d{4}, .*test accuracy \d+\.\d%", evals[0])
    assert [r["step"] + 1 for r in events_of(out, "eval")] == [20, 40, 60]


def test_workers_do_not_flood_the_default_log(default_run):
    """Info on every rank by default: the workers say (next to) nothing at info."""
    proc = default_run[0]
    assert not [line for line in proc.stderr.splitlines() if re.search(r"\[rank [1-9]\d*\]", line)], proc.stderr


def test_log_dir_holds_a_dated_log_per_rank(default_run):
    proc, _, logs = default_run[:3]
    assert sorted(p.name for p in logs.iterdir()) == [f"rank-{r}.log" for r in range(RANKS)]
    for rank in range(RANKS):
        lines = (logs / f"rank-{rank}.log").read_text().splitlines()
        assert lines and all(DATED.match(line) and DATED.match(line).group(1) == str(rank) for line in lines)
        assert f"log of rank {rank}: process " in lines[0]
    rank0 = (logs / "rank-0.log").read_text()
    assert "step 1/60" in rank0 and "step 60/60" in rank0 and "step 40 eval: " in rank0


def test_every_metrics_record_has_its_time(default_run):
    _, out, _, began, ended = default_run
    records = read_metrics(out / "metrics.jsonl")
    assert records and {r.get("event") for r in records} >= {None, "eval", "summary"}
    times = [r["time"] for r in records]
    assert all(isinstance(t, float) for t in times)
    assert times == sorted(times)
    assert began - 0.001 <= times[0] and times[-1] <= ended + 0.001
    assert len(steps_of(out)) == STEPS


def test_log_level_warning_silences_progress_and_evaluations(tmp_path):
    proc = run_train(RANKS, _args(tmp_path / "run", "--log-interval", "0.2", "--log-level", "warning"), timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert " INFO " not in proc.stderr and " eval: " not in proc.stderr, proc.stderr
    assert f"{STEPS} steps in" in proc.stdout  # the closing report is printed, not logged
    assert len(events_of(tmp_path / "run", "eval")) == 3


# --- in-process, no MPI ---------------------------------------------------------------------------------------


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[tuple[str, str]] = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))


@pytest.fixture
def pgc_log():
    """The `pgc_mpi` logger at INFO with a handler that keeps its lines; restored afterwards."""
    log = logging.getLogger("pgc_mpi")
    saved = (list(log.handlers), log.level, log.propagate)
    handler = _Lines()
    log.handlers, log.propagate = [handler], False
    log.setLevel(logging.INFO)
    yield log, handler.lines
    for h in log.handlers:
        if h not in saved[0]:
            h.close()
    log.handlers, log.level, log.propagate = saved


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_logs_every_interval_of_wall_time_and_the_first_and_last_step(pgc_log):
    log, lines = pgc_log
    clock = _Clock()
    progress = Progress(100, 1.0, log, stream=io.StringIO(), clock=clock)
    assert not progress.tty
    for step in range(100):
        clock.now += 0.0625  # 16 steps/s (exact in binary: no rounding at the interval's edge)
        progress.update(step, 0.5, 0.0625, 2)
    progress.close()
    texts = [text for _, text in lines]
    assert [int(re.match(r"step (\d+)/100", t).group(1)) for t in texts] == [1, 17, 33, 49, 65, 81, 97, 100]
    assert "steps/s" not in texts[0]  # one step says nothing of the rate
    assert texts[1] == "step 17/100  loss 0.5000  step 62.5 ms  16 steps/s  time left 5 s  stragglers skipped 2"
    assert all("  16 steps/s  " in t for t in texts[1:])
    assert texts[-1].endswith("time left 0 s  stragglers skipped 2")


def test_progress_of_a_run_stopped_early_ends_with_its_last_step(pgc_log):
    log, lines = pgc_log
    clock = _Clock()
    progress = Progress(1000, 10.0, log, stream=io.StringIO(), clock=clock)
    for step in range(30):
        clock.now += 0.5
        progress.update(step, 1.0, 0.5, 0)
    progress.close()  # stopped at step 30 (the target loss, a signal)
    assert [text.split("  ")[0] for _, text in lines] == ["step 1/1000", "step 21/1000", "step 30/1000"]
    assert "2 steps/s  time left 8 min 05 s" in lines[-1][1]


def test_progress_on_a_terminal_redraws_one_line(pgc_log):
    log, lines = pgc_log

    class Tty(io.StringIO):
        def isatty(self):
            return True

    clock, stream = _Clock(), Tty()
    progress = Progress(50, 10.0, log, stream=stream, clock=clock)
    for step in range(50):
        clock.now += 0.01
        progress.update(step, 1.0, 0.01, 0)
    progress.close()
    assert not lines  # nothing logged
    drawn = stream.getvalue().split("\r")[1:]
    assert 4 <= len(drawn) <= 7 and drawn[-1].startswith("step 50/50") and stream.getvalue().endswith("\n")


def test_durations_read_well():
    assert [_duration(s) for s in (0.4, 45, 185, 7440, float("nan"))] == ["0 s", "45 s", "3 min 05 s", "2 h 04 min",
                                                                           "?"]


def _control(tmp_path, losses, lr=0.5):
    values = iter(losses)
    return RunControl(ControlSettings(steps=len(losses), eval_every=1, lr=lr), tmp_path,
                      evaluate=lambda: {"train_loss": next(values), "test_accuracy": 0.872}, write=lambda r: None)


def test_a_training_loss_rising_twice_warns_once_about_the_learning_rate(tmp_path, pgc_log):
    _, lines = pgc_log
    losses = [1.0, 0.61, 0.64, 0.70, 0.8, 0.9, 1.2, 0.5, 0.7, 0.9]
    ctl = _control(tmp_path, losses)
    for t in range(len(losses)):
        ctl.after_step(t, 1.0)
    warnings = [text for level, text in lines if level == "WARNING"]
    # 0.61 -> 0.64 -> 0.7 (+15%) is within SGD noise; 0.64 -> 0.7 -> 0.8 (+25%) is not
    assert warnings == ["training loss rose over the last 2 evaluations (0.64 -> 0.7 -> 0.8): the learning rate "
                        "(--lr 0.5) is likely too high; try a smaller one"]
    assert ctl.warned_lr
    assert ("INFO", "step 2 eval: train loss 0.6100, test accuracy 87.2%") in lines


@pytest.mark.parametrize("losses", [[1.0, 0.9, 0.8, 0.7], [1.0, 1.3, 0.9, 1.3, 0.8], [1.0, float("nan"), 1.3, 1.6],
                                    [0.505, 0.511, 0.518, 0.6]])
def test_no_learning_rate_warning_without_two_rises_in_a_row(tmp_path, pgc_log, losses):
    _, lines = pgc_log
    ctl = _control(tmp_path, losses)
    for t in range(len(losses)):
        ctl.after_step(t, 1.0)
    assert not [text for level, text in lines if level == "WARNING"] and not ctl.warned_lr


def test_metrics_records_carry_the_time_they_were_written(tmp_path):
    writer = MetricsWriter(tmp_path)
    began = time.time()
    record = {"step": 0, "loss": 1.0}
    writer.write(record)
    writer.write({"event": "eval", "step": 0, "time": 12.5})  # a time of its own is kept
    writer.close()
    first, second = read_metrics(tmp_path / "metrics.jsonl")
    assert record == {"step": 0, "loss": 1.0}  # the caller's dict is left alone
    assert began - 0.001 <= first["time"] <= time.time() + 0.001  # to the millisecond: rounded either way
    assert first["time"] == round(first["time"], 3)
    assert second["time"] == 12.5


def test_configure_logging_level_and_log_dir(tmp_path, pgc_log):
    log = configure_logging(2, "warning", tmp_path / "logs")
    log.info("not shown")
    log.warning("shown")
    lines = (tmp_path / "logs" / "rank-2.log").read_text().splitlines()
    assert len(lines) == 2 and all(DATED.match(line).group(1) == "2" for line in lines)
    assert "log of rank 2: process" in lines[0] and lines[1].endswith("[rank 2] WARNING shown")
    assert configure_logging(0, "debug").level == logging.DEBUG


def test_a_log_dir_that_cannot_be_created_is_a_config_error(tmp_path):
    """Rank 0 creates --log-dir while it checks the flags: a failure is one line and exit status 2 everywhere."""
    from pgc_mpi.errors import ConfigError
    from pgc_mpi.job import startup
    from pgc_mpi.runs import run_lock

    (tmp_path / "a-file").touch()
    with pytest.raises(ConfigError, match=r"^--log-dir \S+/a-file/logs: cannot create the directory: Not a directory"):
        startup.configure(lambda: config_from_args(["--steps", "3", "--out", str(tmp_path / "run"), "--log-dir",
                                                    str(tmp_path / "a-file/logs")]),
                          ranks=5, prog="pgc-train")
    startup.configure(lambda: config_from_args(["--steps", "3", "--out", str(tmp_path / "run"), "--log-dir",
                                                str(tmp_path / "logs")]), ranks=5, prog="pgc-train")
    run_lock.release_all()
    assert (tmp_path / "logs").is_dir()
