"""DropCompute's rule (pgc_mpi.core.drop_compute) and the simulator's use of it."""

from __future__ import annotations

import numpy as np
import pytest

from pgc_mpi.config import SimConfig, TrainConfig
from pgc_mpi.core.drop_compute import AUTO_STEPS, best_threshold, micro_batches_done
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.problems import LeastSquares
from pgc_mpi.sim.simulator import simulate


def test_a_job_starts_its_micro_batches_until_the_threshold():
    # 4 micro-batches of 0.05 s: they start at 0, 0.05, 0.1, 0.15
    assert [micro_batches_done(0.2, 4, t) for t in (0.01, 0.049, 0.07, 0.12, 0.16, 1.0)] == [1, 1, 2, 3, 4, 4]
    assert micro_batches_done(0.0, 4, 0.01) == 4  # a job of no time computes everything


def test_the_simulated_step_is_cut_at_the_threshold_and_averages_what_was_computed():
    """dgd on 4 workers, worker 0 always 0.15 s slow: its job of 0.2 s has 4 micro-batches of
    0.05 s; with a threshold of 0.07 it computes two, and every step takes 0.1 s, not 0.2."""
    problem = LeastSquares(4, samples=400, dim=10, batch_size=8, seed=1)
    base = dict(scheme="dgd", workers=4, steps=6, accumulate=4, delay="fixed:0:0.15", compute_time=0.05,
                momentum=0.0, lr=0.1)
    full = simulate(SimConfig(**base), problem, record_params=True)
    cut = simulate(SimConfig(**base, drop_compute=0.07), problem, record_params=True)
    assert [round(r["step_time"], 9) for r in full.records] == [0.2] * 6
    assert [round(r["step_time"], 9) for r in cut.records] == [0.1] * 6
    assert [r["computed_share"] for r in cut.records] == [14 / 16] * 6
    assert "computed_share" not in full.records[0]
    # the first step's gradient is the mean over the 14 micro-batches computed (from the same start)
    w0, lr = full.trajectory[0], 0.1
    sums, count = np.zeros_like(w0), 0
    for worker in range(4):
        for j in range(2 if worker == 0 else 4):
            sums += problem.grad(w0, worker, j)
            count += 1
    assert np.allclose(cut.trajectory[1], w0 - lr * sums / count, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("config,message", [
    (dict(scheme="pgc-fr", accumulate=4, drop_compute=0.1), "--drop-compute applies to dgd"),
    (dict(scheme="dgd", accumulate=1, drop_compute=0.1), "give --accumulate K >= 2"),
    (dict(scheme="dgd", accumulate=4, drop_compute=-1.0), "--drop-compute must be a number of seconds > 0, or auto"),
    (dict(scheme="dgd", accumulate=4, drop_compute="fast"), "--drop-compute must be a number of seconds > 0, or auto"),
])
def test_drop_compute_refuses_what_it_cannot_do_in_one_line(config, message):
    with pytest.raises(ConfigError, match=message):
        SimConfig(workers=4, **config)
    with pytest.raises(ConfigError, match=message):
        TrainConfig(batch_size=8, **config).validate(5)


def test_ddp_takes_drop_compute_and_the_simulator_does_not_run_ddp():
    TrainConfig(scheme="ddp", batch_size=8, accumulate=4, drop_compute=0.1).validate(5)
    with pytest.raises(ConfigError, match="give --accumulate K >= 2"):
        TrainConfig(scheme="ddp", batch_size=8, drop_compute=0.1).validate(5)
    with pytest.raises(ConfigError, match="'ddp' runs only under pgc-train"):
        SimConfig(scheme="ddp", accumulate=4, drop_compute=0.1)


def test_the_automatic_threshold_computes_the_most_micro_batches_per_second():
    """Worker 0's jobs take 0.2 s, the other three's 0.05 s, 4 micro-batches each, 5 ms of
    overhead a step. Cutting worker 0 to its first micro-batch (the others start their last at
    0.0375 s) gives 13 micro-batches in 0.055 s instead of 16 in 0.205: the threshold lies midway
    between 0.0375 and 0.05, the next start. Equal jobs leave nothing to gain: inf."""
    jobs = np.full((20, 4), 0.05)
    jobs[:, 0] = 0.2
    threshold, share, speedup = best_threshold(jobs, 4, 0.005)
    assert threshold == pytest.approx(0.04375) and share == 13 / 16
    assert speedup == pytest.approx((13 / 0.055) / (16 / 0.205))
    assert best_threshold(np.full((20, 4), 0.05), 4, 0.005) == (float("inf"), 1.0, 1.0)
    # by brute force over a fine grid, nothing beats it
    grid = np.linspace(0.001, 0.25, 500)
    speeds = [sum(micro_batches_done(j, 4, t) for j in jobs[0]) /
              (max(micro_batches_done(j, 4, t) * j / 4 for j in jobs[0]) + 0.005) for t in grid]
    assert max(speeds) <= (13 / 0.055) * (1 + 1e-9)


def test_the_simulator_chooses_the_threshold_after_its_measured_steps():
    """--drop-compute auto: steps 1..20 are measured whole, step 20's record carries the choice,
    and from step 21 on the slow worker computes one micro-batch of four."""
    problem = LeastSquares(4, samples=400, dim=10, batch_size=8, seed=1)
    cfg = SimConfig(scheme="dgd", workers=4, steps=AUTO_STEPS + 5, accumulate=4, delay="fixed:0:0.15",
                    compute_time=0.05, drop_compute="auto")
    records = simulate(cfg, problem).records
    assert all("computed_share" not in r and "drop_threshold" not in r for r in records[:AUTO_STEPS])
    assert 0.0375 < records[AUTO_STEPS]["drop_threshold"] < 0.05
    assert [r["computed_share"] for r in records[AUTO_STEPS + 1:]] == [13 / 16] * 4
    assert [round(r["step_time"], 9) for r in records[AUTO_STEPS + 1:]] == [0.05] * 4


def test_drop_compute_auto_is_a_flag_a_toml_value_and_a_keyword():
    from pgc_mpi.config.options import build_parser

    args = build_parser().parse_args(["--drop-compute", "auto"])
    assert args.drop_compute == "auto"
    assert build_parser().parse_args(["--drop-compute", "0.25"]).drop_compute == 0.25
    from pgc_mpi.config.train import config_from_options

    assert config_from_options({"drop_compute": "auto"}).drop_compute == "auto"
    assert config_from_options({"drop_compute": 1}).drop_compute == 1.0
    with pytest.raises(ConfigError, match="'drop_compute' must be of type float"):
        config_from_options({"drop_compute": [1]})
    TrainConfig(scheme="dgd", batch_size=8, accumulate=4, drop_compute="auto").validate(5)
