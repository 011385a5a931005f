"""The simulator's turnarounds: pgc_mpi.runs.delays measures a pgc-sim run's known delays back."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pgc_mpi.config import SimConfig
from pgc_mpi.core.message import MessageRecord
from pgc_mpi.core.stragglers import DelayModel
from pgc_mpi.learning.problems import Logistic
from pgc_mpi.runs.delays import extras, measure, summarize, write_trace
from pgc_mpi.sim.cli import main as sim_main
from pgc_mpi.sim.simulator import simulate


def test_a_pgc_sim_run_gives_its_injected_delay_back(tmp_path, capsys):
    out = tmp_path / "sim.jsonl"
    assert sim_main(["--problem", "logistic", "--samples", "64", "--dim", "4", "-n", "4", "--schemes", "dgd,pgc-cr",
                     "--steps", "300", "--compute-time", "0.02", "--delay", "exp:0.05", "--seed", "1",
                     "--eval-every", "1000", "--out", str(out)]) == 0
    capsys.readouterr()
    dgd = measure(out, scheme="dgd")
    assert dgd.overall.count == 4 * 295 and dgd.first_step == 5
    assert dgd.overall.mean == pytest.approx(0.05, rel=0.1)  # the nominal mean
    assert dgd.overall.mean == pytest.approx(dgd.injected_mean, rel=1e-6)  # the draws: nothing else on the clock
    assert all(e.extra == pytest.approx(e.delay, abs=1e-9) for e in dgd.extras)
    assert dgd.fit.family == "exp" and float(dgd.fit.spec[4:]) == pytest.approx(0.05, rel=0.1)
    assert not dgd.slow and not dgd.correlated
    # pgc-cr: a late message waits for nobody either; its worker's next model leaves at once
    coded = measure(out, scheme="pgc-cr")
    assert coded.overall.mean == pytest.approx(coded.injected_mean, rel=1e-6)


def test_turnaround_is_from_the_model_reaching_the_worker_to_the_master_taking_the_message():
    cfg = SimConfig(scheme="pgc-cr", workers=4, stragglers=1, steps=60, delay="exp:0.05+fixed:2:0.3",
                    compute_time=0.02, eval_every=1000, seed=2)
    res = simulate(cfg, Logistic(4, samples=64, dim=4, batch_size=4))
    messages = [MessageRecord._make(m) for r in res.records for m in r["messages"]]
    first = [m for m in messages if m.step == 0]
    # the first job starts after pgc-cr's warm-up gradient (its stale slot), from the model given at time 0
    warmup = 0.02 * len(cfg.make_scheme(4).warmup_slots(0))
    assert warmup > 0 and first and all(m.turnaround == pytest.approx(warmup + m.compute_time + m.delay) for m in first)
    later = [m for m in messages if m.step > 0]
    assert all(m.turnaround == pytest.approx(m.compute_time + m.delay) for m in later)
    report = summarize(extras(res.records))
    assert list(report.slow) == [2] and report.slow[2] == pytest.approx(0.3, rel=0.15)
    assert report.fit.spec.startswith("fixed:2:")
    DelayModel(report.fit.spec, 4)


def test_a_master_that_takes_time_shows_in_the_turnaround(tmp_path):
    """With --master-cost a message may wait for the master (taking in the others, updating): its
    extra then exceeds its delay, never falls short of it."""
    from pgc_mpi.sim.master_cost import MasterCost, PartCost, save

    save(MasterCost(receive=PartCost(fixed=0.01), update=PartCost(fixed=0.05)), tmp_path / "cost.json")
    cfg = SimConfig(scheme="pgc-cr", workers=4, stragglers=1, steps=40, delay="exp:0.05", compute_time=0.02,
                    eval_every=1000, master_cost=str(tmp_path / "cost.json"))
    found = extras(simulate(cfg, Logistic(4, samples=64, dim=4, batch_size=4)).records, warmup=0)
    assert all(e.extra >= e.delay - 1e-12 for e in found) and any(e.extra > e.delay + 1e-3 for e in found)


def test_a_measured_trace_replays_the_same_delays_in_the_simulator(tmp_path):
    cfg = SimConfig(scheme="dgd", workers=4, steps=40, delay="exp:0.05", compute_time=0.02, eval_every=1000)
    problem = Logistic(4, samples=64, dim=4, batch_size=4)
    found = extras(simulate(cfg, problem).records)
    write_trace(found, tmp_path / "trace.csv")
    again = simulate(SimConfig(**{**cfg.__dict__, "delay": f"trace:{tmp_path / 'trace.csv'}"}), problem)
    replayed = {(e.worker, e.step): e.extra for e in extras(again.records)}
    assert replayed == pytest.approx({(e.worker, e.step): e.extra for e in found}, abs=1e-9)
    assert not math.isnan(np.mean(list(replayed.values())))
