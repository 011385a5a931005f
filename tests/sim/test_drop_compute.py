"""DropCompute's rule (pgc_mpi.core.drop_compute) and the simulator's use of it."""

from __future__ import annotations

import numpy as np
import pytest

from pgc_mpi.config import SimConfig, TrainConfig
from pgc_mpi.core.drop_compute import micro_batches_done
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
    (dict(scheme="dgd", accumulate=4, drop_compute=-1.0), "--drop-compute must be a number > 0"),
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
