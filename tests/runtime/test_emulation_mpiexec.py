"""--compute-time: ranks that share cores behave like cluster nodes with a fixed gradient cost."""

from __future__ import annotations

import math

import numpy as np

from pgc_mpi.core.message import MessageRecord

from helpers import run_train, steps_of


def _messages(out):
    return [MessageRecord._make(m) for r in steps_of(out) for m in r["messages"]]


def test_every_gradient_takes_at_least_the_emulated_compute_time(tmp_path):
    """gc-cr computes c = 2 gradients per step, dgd one: with 50 ms per gradient their steps take
    about 100 and 50 ms, whatever the two cores do; each message records both times."""
    medians = {}
    for scheme in ("dgd", "gc-cr", "pgc-cr"):
        out = tmp_path / scheme
        proc = run_train(5, ["--scheme", scheme, "-s", "1", "--steps", "12", "--compute-time", "0.05",
                             "--problem", "logistic", "--eval-every", "100", "--out", str(out)])
        assert proc.returncode == 0, proc.stderr[-2000:]
        messages = [m for m in _messages(out) if m.verdict != "rejected"]
        assert all(m.compute_time >= 0.05 * m.gradients - 1e-3 for m in messages)
        assert all(0 < m.real_compute_time <= m.compute_time for m in messages)
        medians[scheme] = float(np.median([r["step_time"] for r in steps_of(out)]))
    assert 0.05 <= medians["dgd"] < 0.09, medians
    assert 0.10 <= medians["gc-cr"] < 0.16, medians
    assert medians["pgc-cr"] < 0.8 * medians["gc-cr"], medians


def test_records_written_before_real_compute_time_still_read():
    old = MessageRecord._make([3, 7, 0.1, 0.2, 1, "used"])
    assert old.verdict == "used" and math.isnan(old.real_compute_time)


def test_compute_time_must_be_positive():
    import pytest

    from pgc_mpi.config import TrainConfig
    from pgc_mpi.errors import ConfigError

    for bad in (0, -1.0, math.inf, "fast"):
        with pytest.raises(ConfigError, match="--compute-time must be a number > 0"):
            TrainConfig(compute_time=bad).validate(4)


def test_fixed_minibatch_under_mpi_equals_its_replay(tmp_path):
    """--fixed-minibatch: the authors' sampling (each partition's first minibatch, every time)."""
    from pgc_mpi.core.schemes import make_scheme
    from pgc_mpi.learning.datasets import load_digits
    from pgc_mpi.learning.problems import FirstMinibatch
    from pgc_mpi.learning.torch_problem import TorchProblem
    from pgc_mpi.sim.replaying import replay

    out = tmp_path / "run"
    proc = run_train(5, ["--scheme", "pgc-cr", "--steps", "8", "--dtype", "float64", "--batch-size", "16", "--lr",
                         "0.5", "--seed", "2", "--record-params", "--eval-every", "100", "--fixed-minibatch",
                         "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    problem = TorchProblem("logreg", load_digits(2), 4, 16, seed=2, dtype="float64")
    got = np.load(out / "params.npy")
    fixed = replay(make_scheme("pgc-cr", 4, 1, seed=2), FirstMinibatch(problem), steps_of(out), lr=0.5)
    assert np.abs(got - np.stack(fixed)).max() < 1e-10
    drawn = replay(make_scheme("pgc-cr", 4, 1, seed=2), problem, steps_of(out), lr=0.5)
    assert np.abs(got - np.stack(drawn)).max() > 1e-6  # not the default sampling
