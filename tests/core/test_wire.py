"""--wire-dtype: rounding to the wire format, the options, and the simulator's messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pgc_mpi.config import SimConfig, TrainConfig
from pgc_mpi.core.wire import WIRE_DTYPES, wire_format
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.problems import LeastSquares
from pgc_mpi.sim.replaying import replay
from pgc_mpi.sim.simulator import simulate


def _awkward_values() -> np.ndarray:
    """Random normals over many magnitudes, plus the cases rounding gets wrong first: ties, the
    largest finite values, subnormals, signed zeros, infinities, NaN."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal(10_000).astype(np.float32) * np.float32(10.0) ** rng.integers(-30, 30, 10_000)
    ties = (np.arange(1000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exactly halfway between two
    special = np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max, 1e-40, -1e-40, 0.0, -0.0,
                        np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e-8], dtype=np.float32)
    return np.concatenate([values, ties, special])


def test_bfloat16_rounds_as_torch_does():
    values = _awkward_values()
    wire = wire_format("bfloat16", np.float32)
    got = wire.round_trip(values)
    expected = torch.from_numpy(values).to(torch.bfloat16).to(torch.float32).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)  # NaN where torch has NaN, the rest bit for bit


def test_float16_rounds_as_numpy_does_and_overflows_to_inf_without_a_warning():
    values = _awkward_values()
    wire = wire_format("float16", np.float64)
    with np.errstate(all="raise"):
        stored = np.empty(values.shape, wire.storage)
        wire.encode(values.astype(np.float64), stored)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(stored, values.astype(np.float16))
    assert np.isinf(stored[values == np.finfo(np.float32).max]).all()
    assert wire.decode(stored).dtype == np.float64


def test_the_runs_own_dtype_is_passed_through_without_a_copy():
    wire = wire_format(None, "float32")
    payload = np.arange(4, dtype=np.float32)
    assert not wire.narrowed and wire.decode(payload) is payload and wire.round_trip(payload) is payload
    assert not wire_format("float32", "float32").narrowed and wire_format("float32", "float64").narrowed
    assert wire_format("bfloat16", "float64").storage == np.uint16


def test_relative_rounding_error_is_the_formats_precision_in_its_normal_range():
    values = np.random.default_rng(1).standard_normal(100_000)
    for name, eps in (("float32", 2.0**-24), ("bfloat16", 2.0**-8), ("float16", 2.0**-11)):
        normal = np.abs(values) >= np.finfo(np.float16 if name == "float16" else np.float32).tiny
        err = np.abs(wire_format(name, np.float64).round_trip(values) - values) / np.abs(values)
        assert err[normal].max() <= eps * (1 + 1e-6), name
        assert err[normal].max() > eps / 2, name  # and not better than it: the numbers were rounded
    # below float16's normal range (6.1e-5) precision falls away: 1e-8 is lost altogether
    assert wire_format("float16", np.float64).round_trip(np.array([1e-8]))[0] == 0


def test_the_option_is_checked_and_refused_with_ddp():
    with pytest.raises(ConfigError, match="--wire-dtype 'int8' is not one of: " + ", ".join(WIRE_DTYPES)):
        SimConfig(workers=4, wire_dtype="int8")
    with pytest.raises(ConfigError, match="--wire-dtype is not supported with --scheme ddp"):
        TrainConfig(scheme="ddp", wire_dtype="bfloat16").validate(4)


def test_simulated_messages_are_rounded_and_counted_in_wire_bytes():
    problem = LeastSquares(6, samples=120, dim=400, seed=3)
    base = SimConfig(scheme="pgc-cr", workers=6, stragglers=1, steps=40, lr=0.1, delay="exp:0.5", seed=2)
    runs = {name: simulate(SimConfig(**{**base.__dict__, "wire_dtype": name}), problem, record_params=True)
            for name in (None, "float32", "bfloat16", "float16")}
    exact = np.stack(runs[None].trajectory)
    header = runs[None].records[-1]["bytes_received"] - 400 * 8 * _messages(runs[None])
    for name, itemsize, tol in (("float32", 4, 1e-5), ("bfloat16", 2, 0.1), ("float16", 2, 0.01)):
        res = runs[name]
        assert res.records[-1]["bytes_received"] == _messages(res) * 400 * itemsize + header
        drift = np.abs(np.stack(res.trajectory) - exact).max() / np.abs(exact).max()
        assert 0 < drift < tol, (name, drift)
        assert res.evals[-1]["gap"] < 1e-3 * res.evals[0]["gap"]  # still trains


def _messages(res) -> int:
    return sum(len(r["messages"]) for r in res.records)


def test_replay_rounds_as_the_simulator_does():
    problem = LeastSquares(6, samples=120, dim=50, seed=3)
    cfg = SimConfig(scheme="gc-cr", workers=6, stragglers=2, steps=15, lr=0.2, delay="exp:0.5", seed=4,
                    wire_dtype="bfloat16")
    res = simulate(cfg, problem, record_params=True)
    again = replay(cfg.make_scheme(6), problem, res.records, lr=0.2, wire_dtype="bfloat16")
    np.testing.assert_array_equal(np.stack(again), np.stack(res.trajectory))


def test_the_decode_error_estimate_follows_the_decode_weights():
    bf16, none = wire_format("bfloat16", np.float64), wire_format(None, np.float64)
    mean = np.full(12, 1 / 12)
    assert bf16.decode_error(mean) == pytest.approx(2.0**-8) and none.decode_error(mean) == 0
    assert bf16.decode_error(None) == pytest.approx(2.0**-8)  # pbs: the table's mean
    large = np.zeros(12)
    large[3] = 70.0  # gc-cr's weights for an unlucky arrival set at s = 2 (docs/BENCHMARKS.md section 14)
    assert bf16.decode_error(large) == pytest.approx(2.0**-8 * 12 * 70)
    assert bf16.decode_error(large) > 1
    assert wire_format("float32", np.float64).decode_error(large) < 1e-4


def test_simulated_steps_record_the_estimate():
    problem = LeastSquares(6, samples=120, dim=50, seed=3)
    cfg = SimConfig(scheme="gc-cr", workers=6, stragglers=2, steps=10, lr=0.1, delay="exp:0.5", seed=4)
    assert all(r["wire_error"] == 0 for r in simulate(cfg, problem).records)
    narrow = simulate(SimConfig(**{**cfg.__dict__, "wire_dtype": "float16"}), problem).records
    assert all(r["wire_error"] >= 2.0**-11 for r in narrow)
