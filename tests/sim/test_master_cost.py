"""The master's cost model: fitting, files, and the simulator charging it on its clock."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pgc_mpi.config import SimConfig
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.problems import LeastSquares
from pgc_mpi.runs.metrics import MASTER_PARTS
from pgc_mpi.sim.cli import build_parser, configs_from_args
from pgc_mpi.sim.cli import main as sim_main
from pgc_mpi.sim.master_cost import MasterCost, PartCost, fit, load, save
from pgc_mpi.sim.simulator import simulate

COST = MasterCost(receive=PartCost(fixed=0.002, per_mnum=0.01), decode=PartCost(fixed=0.003),
                  update=PartCost(fixed=0.004, per_mnum=1.0), send=PartCost(fixed=0.001, per_worker=0.0005))


@pytest.fixture(scope="module")
def lsq() -> LeastSquares:
    return LeastSquares(6, samples=120, dim=10, seed=3)


def test_fit_recovers_the_constants_of_exact_linear_costs():
    rows = [{"workers": n, "numbers": d, **{part: getattr(COST, part).seconds(n, d) for part in MASTER_PARTS}}
            for n in (8, 16, 32, 64) for d in (100_000, 1_000_000)]
    fitted = fit(rows)
    for part in MASTER_PARTS:
        assert getattr(fitted, part).seconds(1000, 5_000_000) == pytest.approx(
            getattr(COST, part).seconds(1000, 5_000_000), rel=1e-9)


def test_fit_never_gives_a_negative_constant():
    # sending gets cheaper with N here: the unconstrained fit would charge a negative time per worker
    rows = [{"workers": n, "numbers": d, "receive": 1e-3, "decode": 0.0, "update": 1e-3,
             "send": 1e-3 - 1e-6 * n + 1e-4 * d / 1e6} for n in (8, 64) for d in (100_000, 1_000_000)]
    fitted = fit(rows)
    assert all(v >= 0 for part in MASTER_PARTS for v in vars(getattr(fitted, part)).values())
    assert fitted.send.per_worker == 0 and fitted.decode == PartCost()


def test_a_saved_model_loads_back_equal(tmp_path):
    path = tmp_path / "cost.json"
    save(MasterCost(**{p: getattr(COST, p) for p in MASTER_PARTS}, measured={"machine": "here"}), path)
    back = load(path)
    assert [getattr(back, p) for p in MASTER_PARTS] == [getattr(COST, p) for p in MASTER_PARTS]
    assert back.measured == {"machine": "here"}


@pytest.mark.parametrize("content,words", [
    (None, "no such file"),
    ("{not json", "not a readable JSON"),
    (json.dumps({"parts": {"receive": {}}}), "exactly receive, decode, update, send"),
    (json.dumps({"parts": {p: {"fixed": -1.0} for p in MASTER_PARTS}}), "receive.fixed must be a finite number"),
    (json.dumps({"parts": {p: {"per_byte": 1.0} for p in MASTER_PARTS}}), "must map some of fixed, per_worker"),
])
def test_a_bad_cost_file_is_refused_with_a_one_line_reason(tmp_path, content, words):
    path = tmp_path / "cost.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=words) as err:
        load(str(path))  # as pgc-sim does with its options, and the simulator before its first step
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=words):
        configs_from_args(build_parser().parse_args(["--master-cost", str(path), "--schemes", "dgd"]))


def test_without_stragglers_a_dgd_step_is_compute_then_every_receive_then_the_step_parts(lsq, tmp_path):
    path = tmp_path / "cost.json"
    save(COST, path)
    cfg = SimConfig(scheme="dgd", workers=6, stragglers=0, steps=5, delay="none", compute_time=1.0,
                    master_cost=str(path))
    res = simulate(cfg, lsq)
    receive = COST.receive_seconds(6, lsq.dim)
    parts = COST.step_seconds(6, lsq.dim)
    for r in res.records:
        assert r["step_time"] == pytest.approx(1.0 + 6 * receive + sum(parts.values()))
        assert r["receive_time"] == pytest.approx(6 * receive)
        assert [r[f"{p}_time"] for p in ("decode", "update", "send")] == pytest.approx(list(parts.values()))


def test_a_cost_model_of_zeros_changes_nothing(lsq, tmp_path):
    path = tmp_path / "zero.json"
    save(MasterCost(), path)
    base = SimConfig(scheme="pgc-cr", workers=6, stragglers=1, steps=30, delay="exp:0.5", seed=2)
    free = simulate(base, lsq, record_params=True)
    zero = simulate(SimConfig(**{**base.__dict__, "master_cost": str(path)}), lsq, record_params=True)
    assert [r["wall_time"] for r in zero.records] == [r["wall_time"] for r in free.records]
    assert all(np.array_equal(a, b) for a, b in zip(zero.trajectory, free.trajectory))


def test_a_costly_master_slows_the_simulated_run_and_a_missing_file_is_a_clear_cli_error(lsq, tmp_path, capsys):
    path = tmp_path / "cost.json"
    save(COST, path)
    base = SimConfig(scheme="pgc-cr", workers=6, stragglers=1, steps=30, delay="exp:0.5", seed=2)
    free = simulate(base, lsq)
    costly = simulate(SimConfig(**{**base.__dict__, "master_cost": str(path)}), lsq)
    assert costly.records[-1]["wall_time"] > free.records[-1]["wall_time"]
    assert sim_main(["--schemes", "dgd", "-n", "6", "--steps", "3", "--master-cost", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert "--master-cost" in err and "no such file" in err and len(err.strip().splitlines()) == 1
