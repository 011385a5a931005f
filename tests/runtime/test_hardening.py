"""Bad input refused in-process: checkpoints against the run, set-up errors, bounded sleeps, traces."""

from __future__ import annotations

import json
import time

import h5py
import numpy as np
import pytest

from pgc_mpi.core import stragglers
from pgc_mpi.core.stragglers import DelayModel
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.optim import FlatOptimizer
from pgc_mpi.runs import checkpoint
from pgc_mpi.runs.checkpoint import CheckpointError

IDENTITY = {"scheme": "pgc-cr", "n": 4, "s": 1, "c": 2, "dim": 5, "dtype": "float64", "model": "logreg",
            "dataset": "digits", "optimizer": "momentum"}


@pytest.fixture
def ckpt(tmp_path):
    w = np.linspace(0, 1, 5)
    opt = FlatOptimizer(w, "momentum", 0.1)
    opt.grad[:] = 1.0
    opt.step()
    return checkpoint.save(tmp_path, 3, w, opt.opt.state_dict(), IDENTITY, {})


def _edit(path, name, data):
    """Replace a dataset and seal the file again: a checkpoint written so (a bug, a crafted file)
    passes the digest, and the checks of its arrays must refuse it."""
    with h5py.File(path, "a") as f:
        del f[name]
        f.create_dataset(name, data=data)
    checkpoint.seal(path)


@pytest.mark.parametrize("name,data,message", [
    ("params", np.zeros(1), "params has shape \\(1,\\), this run needs \\(5,\\)"),
    ("params", np.zeros(5, dtype=np.float32), "params is float32, this run needs float64"),
    ("params", np.array([0, 1, np.nan, 3, 4.0]), "params contains NaN or Inf"),
    ("optimizer/momentum_buffer", np.zeros(7), "optimizer/momentum_buffer has shape"),
    ("torch_rng", np.zeros(3, dtype=np.uint8), "torch_rng has shape"),
])
def test_a_checkpoint_array_that_does_not_fit_the_run_is_refused(ckpt, name, data, message):
    _edit(ckpt, name, data)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load(ckpt, IDENTITY)


@pytest.mark.parametrize("groups", [
    [{"lr": float("nan"), "momentum": 0.9}], [{"lr": 0.1, "momentum": 1.5}], [], "not json",
])
def test_damaged_optimizer_settings_are_refused(ckpt, groups):
    with h5py.File(ckpt, "a") as f:
        f.attrs["param_groups"] = groups if isinstance(groups, str) else json.dumps(groups)
    checkpoint.seal(ckpt)  # past the digest: the settings' own check
    with pytest.raises(CheckpointError, match="optimizer settings"):
        checkpoint.load(ckpt, IDENTITY)


def test_a_checkpoint_of_another_optimizer_is_refused(ckpt):
    with pytest.raises(CheckpointError, match="optimizer = 'momentum', this run has 'adam'"):
        checkpoint.load(ckpt, {**IDENTITY, "optimizer": "adam"})


def test_the_flags_win_over_the_checkpoint_s_learning_rate(tmp_path, caplog):
    import logging

    from pgc_mpi.core.schemes import make_scheme
    from pgc_mpi.core.wire import wire_format
    from pgc_mpi.learning.problems import LeastSquares
    from pgc_mpi.runtime.master import Master, MasterSettings

    class Link:  # the transport is not used by the constructor beyond its run's dtype and ranks
        wire = wire_format(None, np.float64)
        first_worker = 1

    problem = LeastSquares(4, samples=40, dim=5)
    w = np.zeros(5)
    opt = FlatOptimizer(w, "momentum", 0.1, momentum=0.5)
    opt.grad[:] = 1.0
    opt.step()
    path = checkpoint.save(tmp_path, 3, w, opt.opt.state_dict(), IDENTITY, {})
    settings = MasterSettings(steps=10, optimizer="momentum", lr=0.02, momentum=0.9)
    with caplog.at_level(logging.INFO, logger="pgc_mpi"):
        master = Master(settings, make_scheme("pgc-cr", 4, 1), problem.initial_params(), Link,
                        resume=checkpoint.load(path, IDENTITY), problem=problem)
    group = master.opt.opt.param_groups[0]
    assert group["lr"] == 0.02 and group["momentum"] == 0.9 and master.start == 3
    np.testing.assert_array_equal(master.opt.opt.state[master.opt.param]["momentum_buffer"].numpy(), np.ones(5))
    assert "lr 0.1 -> 0.02, momentum 0.5 -> 0.9" in caplog.text and "from the flags" in caplog.text


def test_an_unexpected_set_up_error_is_one_line_for_every_rank(monkeypatch, capsys, tmp_path):
    from pgc_mpi.config import config_from_args
    from pgc_mpi.job import startup
    from pgc_mpi.job.recipe import RecipeObjects
    from pgc_mpi.runs import run_lock

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(startup, "build_problem", broken)
    cfg = startup.configure(lambda: config_from_args(["--steps", "3", "--out", str(tmp_path / "run")]), ranks=5,
                            prog="pgc-train")
    try:
        assert startup.attempt(lambda: startup.prepare(cfg, 4, None, None, RecipeObjects())) == (1, None)
    finally:
        run_lock.release_all()
    err = capsys.readouterr().err
    assert "pgc-train: error: RuntimeError: disk on fire while setting up the run" in err
    assert "Traceback" not in err and "second line" not in err


def test_sleeps_never_pass_their_bound():
    from pgc_mpi.runtime.transport import Backoff, _sleep_until

    backoff = Backoff(ceiling=100.0)
    backoff.delay = 100.0
    began = time.monotonic()
    backoff.sleep(until=began + 0.05)
    _sleep_until(100.0, time.monotonic() + 0.05)
    assert time.monotonic() - began < 2.0


def test_a_trace_with_broken_csv_names_the_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"worker,step,delay\n0,1,0.5\n1,2,\"" + b"9" * 200_000 + b"\"\n")  # over csv's field limit
    with pytest.raises(ConfigError, match="line 3 is not CSV text"):
        DelayModel(f"trace:{path}", n=4)
    path.write_bytes(b"worker,step,delay\n0,1,\xff\n")
    with pytest.raises(ConfigError, match="not CSV text"):
        DelayModel(f"trace:{path}", n=4)


def test_an_oversized_trace_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    path.write_text("worker,step,delay\n" + "0,1,0.5\n" * 100)
    monkeypatch.setattr(stragglers, "MAX_TRACE_BYTES", 200)
    with pytest.raises(ConfigError, match="more than the 0 MiB a trace may have"):
        DelayModel(f"trace:{path}", n=4)


def test_a_large_trace_is_compact_and_sums_repeated_rows(tmp_path):
    rows = [(w, t, 0.001 * (w + t)) for w in range(50) for t in range(2000)]
    path = tmp_path / "t.csv"
    stragglers.write_trace(path, [*rows, (3, 7, 1.0)])
    model = DelayModel(f"trace:{path}", n=50)
    assert model.delay(3, 7) == pytest.approx(0.010 + 1.0)
    assert model.delay(49, 1999) == pytest.approx(0.001 * 2048) and model.delay(0, 5000) == 0.0


@pytest.mark.parametrize("options,message", [
    ({"seed": 2**64}, "--seed must be at most 2\\*\\*63 - 1"),
    ({"threads": 10**6}, "--threads 1000000 is more than the"),
    ({"poll_interval": 20.0}, "--poll-interval 20 s is longer than --grace 10 s"),
])
def test_settings_that_used_to_crash_or_hang_are_configuration_errors(options, message):
    from pgc_mpi.config import TrainConfig

    with pytest.raises(ConfigError, match=message):
        TrainConfig(**options).validate(workers=4)


def test_a_full_disk_under_the_metrics_is_one_line_naming_the_file(tmp_path, monkeypatch):
    import errno

    from pgc_mpi.errors import WriteError
    from pgc_mpi.runs.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer._fh, "write", full, raising=False)
    with pytest.raises(WriteError, match=f"{tmp_path}/metrics.jsonl: cannot write: no space left on device"):
        writer.write({"step": 0})


def test_a_staleness_bound_below_the_pipeline_depth_is_refused_not_a_stall():
    from pgc_mpi.config import SimConfig, TrainConfig

    with pytest.raises(ConfigError, match="--max-staleness 1 is below pgc-cr's pipeline depth c-1 = 2"):
        TrainConfig(scheme="pgc-cr", stragglers=2, max_staleness=1).validate(workers=6)
    with pytest.raises(ConfigError, match="pipeline depth"):
        SimConfig(scheme="pgc-fr", workers=6, stragglers=1, max_staleness=0)
    TrainConfig(scheme="pgc-cr", stragglers=2, max_staleness=2).validate(workers=6)
    TrainConfig(scheme="gc-cr", stragglers=2, max_staleness=0).validate(workers=6)  # not pipelined: fresh buffers
