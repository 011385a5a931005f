"""RunControl (pgc_mpi.runtime.control): evaluation, target loss, checkpoints on schedule and on demand,
stop signals."""

from __future__ import annotations

import math
import os
import signal

import pytest

from pgc_mpi.runtime import signals
from pgc_mpi.runtime.control import ControlSettings, RunControl


@pytest.fixture
def clean_signals():
    signals.install()
    signals._requested.clear()
    signals._checkpoints.clear()
    yield
    signals._requested.clear()
    signals._checkpoints.clear()
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)


def _control(tmp_path, losses=(), **settings):
    written = []
    values = iter(losses)
    ctl = RunControl(ControlSettings(**{"steps": 10, **settings}), tmp_path,
                     evaluate=lambda: {"train_loss": next(values), "test_accuracy": 0.5}, write=written.append)
    return ctl, written


def test_evaluates_every_k_steps_and_at_the_last(tmp_path, clean_signals):
    ctl, written = _control(tmp_path, losses=[3.0, 2.0, 1.0], eval_every=4)
    stops = [ctl.after_step(t, 1.0) for t in range(10)]
    assert not any(stops)
    assert [w["step"] for w in written] == [3, 7, 9] and all(w["event"] == "eval" for w in written)
    assert ctl.last_eval == {"step": 9, "train_loss": 1.0, "test_accuracy": 0.5}


def test_target_loss_stops_at_the_first_evaluation_that_reaches_it(tmp_path, clean_signals):
    ctl, _ = _control(tmp_path, losses=[3.0, 0.4], eval_every=2, target_loss=0.5)
    assert [ctl.after_step(t, 9.0) for t in range(4)] == [False, False, False, True]
    assert ctl.stopped_early


def test_without_a_training_evaluation_the_target_uses_recent_minibatch_losses(tmp_path, clean_signals):
    ctl = RunControl(ControlSettings(steps=10, eval_every=2, target_loss=0.5), tmp_path,
                     evaluate=lambda: {"test_loss": 9.0}, write=lambda r: None)
    assert not ctl.after_step(0, 0.1) and not ctl.after_step(1, 1.5)  # mean 0.8
    assert not ctl.after_step(2, math.nan) and ctl.after_step(3, 0.2)  # NaN left out: mean 0.2


def test_checkpoints_on_schedule_on_demand_and_never_after_the_last_step(tmp_path, clean_signals):
    ctl, _ = _control(tmp_path, checkpoint_every=3)
    assert [d for d in range(1, 11) if ctl.checkpoint_due(d)] == [3, 6, 9]
    (tmp_path / "CHECKPOINT").touch()
    assert ctl.checkpoint_due(4) and not (tmp_path / "CHECKPOINT").exists()
    os.kill(os.getpid(), signal.SIGUSR2)
    assert ctl.checkpoint_due(5) and not ctl.checkpoint_due(5)  # each request is answered once
    assert ctl.checkpoint_at_end()  # --checkpoint-every: also at the end
    quiet, _ = _control(tmp_path)
    assert not quiet.checkpoint_at_end()


def test_a_stop_signal_stops_after_an_evaluation_and_asks_for_a_checkpoint(tmp_path, clean_signals):
    ctl, written = _control(tmp_path, losses=[2.0], eval_every=100)
    assert not ctl.after_step(0, 1.0)
    os.kill(os.getpid(), signal.SIGTERM)
    assert ctl.after_step(1, 1.0)  # evaluates the state it stops with
    assert ctl.stopped_by == "SIGTERM" and written[-1]["step"] == 1
    assert ctl.stop_signal(2) and ctl.checkpoint_at_end()
