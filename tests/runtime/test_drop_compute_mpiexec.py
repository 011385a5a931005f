"""--drop-compute under MPI (DropCompute for dgd): a slow worker sends the micro-batches it
computed by the threshold, and the master averages over every micro-batch computed, exactly as
the simulator does (pgc_mpi.core.drop_compute, docs/ALGORITHMS.md §12)."""

from __future__ import annotations

import numpy as np
import pytest

from pgc_mpi.config import SimConfig
from pgc_mpi.core.drop_compute import AUTO_STEPS
from pgc_mpi.learning.datasets import load_digits
from pgc_mpi.learning.torch_problem import TorchProblem
from pgc_mpi.sim.simulator import simulate

from helpers import run_logistic, run_train, steps_of


def _numpy_unless_ddp(scheme: str) -> list[str]:
    """dgd's workers on the NumPy logistic problem (no torch: a job starts in half the time);
    ddp's workers are torch's own (torch.distributed), so ddp keeps the torch model."""
    return [] if scheme == "ddp" else ["--problem", "logistic"]


@pytest.mark.parametrize("scheme", ["dgd", "ddp"])
def test_a_slow_worker_sends_what_it_computed_by_the_threshold_as_the_simulator_says(tmp_path, scheme):
    """dgd (and ddp, the same rule inside its all-reduce) on 4 workers, 4 micro-batches of 8 per
    gradient, 50 ms a gradient, worker 0 always 0.15 s slower: its micro-batches take 50 ms
    each, the others' 12.5 ms. With --drop-compute
    0.07 worker 0 starts its first two only (the third would start at 0.1 s), the others all four:
    14 of 16 micro-batches per step, steps of about 0.1 s instead of 0.2, and the MPI master's
    parameters (ddp: worker 0's) equal the simulator's of dgd at every step (float64): the mean
    over the 14."""
    out = tmp_path / "run"
    steps = 10
    common = dict(scheme="dgd", steps=steps, lr=0.5, momentum=0.0, accumulate=4, delay="fixed:0:0.15",
                  compute_time=0.05, drop_compute=0.07, seed=3)
    proc = run_train(5, ["--scheme", scheme, "--steps", str(steps), "--lr", "0.5", "--momentum", "0",
                         "--batch-size", "8", "--accumulate", "4", "--delay", "fixed:0:0.15", "--compute-time", "0.05",
                         "--drop-compute", "0.07", "--seed", "3", "--dtype", "float64", "--record-params",
                         "--eval-every", "100", "--out", str(out), *_numpy_unless_ddp(scheme)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = steps_of(out)
    assert [r["computed_share"] for r in records] == [14 / 16] * steps
    assert np.median([r["step_time"] for r in records]) < 0.15
    problem = (TorchProblem("logreg", load_digits(3), 4, 8, seed=3, dtype="float64") if scheme == "ddp" else
               run_logistic(4, batch_size=8, seed=3))
    sim = simulate(SimConfig(workers=4, eval_every=steps, **common), problem, record_params=True)
    assert [r["computed_share"] for r in sim.records] == [14 / 16] * steps
    got = np.load(out / "params.npy")
    assert np.abs(got - np.stack(sim.trajectory)).max() < 1e-10
    assert np.abs(got[-1] - got[0]).max() > 1e-3  # it did train


@pytest.mark.parametrize("scheme", ["dgd", "ddp"])
def test_rank_0_chooses_the_threshold_and_the_workers_apply_it(tmp_path, scheme):
    """--drop-compute auto under MPI: worker 0 always 0.15 s slow, 50 ms a gradient of 4
    micro-batches. Rank 0 measures steps 1..20 whole, chooses a threshold that cuts worker 0 to
    its first micro-batch (the others' last starts at 37.5 ms, its second at 50 ms), sends it,
    and the steps after it compute 13 of 16 micro-batches in about 50 ms instead of 200."""
    out = tmp_path / "run"
    steps = AUTO_STEPS + 9
    proc = run_train(5, ["--scheme", scheme, "--steps", str(steps), "--lr", "0.5", "--batch-size", "8",
                         "--accumulate", "4", "--delay", "fixed:0:0.15", "--compute-time", "0.05",
                         "--drop-compute", "auto", "--seed", "3", "--eval-every", "100", "--out", str(out),
                         *_numpy_unless_ddp(scheme)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = steps_of(out)
    assert all("computed_share" not in r for r in records[:AUTO_STEPS + 1])
    assert 0.0375 < records[AUTO_STEPS]["drop_threshold"] < 0.05
    assert records[AUTO_STEPS]["drop_threshold_share"] == 13 / 16
    # the workers apply it from their next job after it arrives (a step or two may still be whole:
    # dgd's models can leave before the choice, ddp's peers run ahead of rank 0's booking), and
    # keep it from then on
    shares = [r.get("computed_share") for r in records[AUTO_STEPS + 1:]]
    applied = shares.index(13 / 16)
    assert applied <= 4 and shares[applied:] == [13 / 16] * (len(shares) - applied)
    assert np.median([r["step_time"] for r in records[-4:]]) < 0.1 < np.median([r["step_time"] for r in records[:20]])
