"""--partitioning under mpiexec (bounded: 4 ranks, digits, 12 steps): pgc-cr on partitions from a
Dirichlet(0.5), its buffers weighed by age (--staleness-correction weights:0.5), equals the
simulator's replay of its arrivals in float64 (the holders of a partition cut it the same, bit for
bit, and every worker weighs its buffers as the simulator does), config.json and the data
fingerprint record it, and a resume with another partitioning is refused in one line."""

from __future__ import annotations

import json

import numpy as np

from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.learning.datasets import load_digits
from pgc_mpi.learning.torch_problem import TorchProblem
from pgc_mpi.sim.replaying import replay

from helpers import run_train, steps_of


def test_pgc_cr_on_dirichlet_partitions_equals_the_simulator_and_a_resume_cut_otherwise_is_refused(tmp_path):
    out, steps, n = tmp_path / "run", 12, 3
    args = ["--scheme", "pgc-cr", "-s", "1", "--steps", str(steps), "--dtype", "float64", "--batch-size", "16",
            "--lr", "0.5", "--seed", "3", "--record-params", "--eval-every", "100", "--staleness-correction",
            "weights:0.5", "--partitioning", "dirichlet:0.5", "--out", str(out)]
    proc = run_train(n + 1, args, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    problem = TorchProblem("logreg", load_digits(3), n, 16, seed=3, dtype="float64", partitioning="dirichlet:0.5")
    scheme = make_scheme("pgc-cr", n, 1, seed=3, staleness_correction="weights:0.5")
    expected = replay(scheme, problem, steps_of(out), lr=0.5)
    got = np.load(out / "params.npy")
    assert got.shape == (steps + 1, problem.dim)
    assert np.abs(got - np.stack(expected)).max() < 1e-10
    assert np.abs(got[-1] - got[0]).max() > 1e-3  # it did train
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["config"]["partitioning"] == "dirichlet:0.5"
    assert recorded["data_fingerprint"]["partitioning"] == "dirichlet:0.5"
    again = run_train(n + 1, [*args[:-4], "--partitioning", "by-label", "--steps", str(steps + 4), "--resume",
                              "latest", "--out", str(out)], timeout=60)
    assert again.returncode == 2, again.stderr[-3000:]
    lines = [line for line in again.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "partitioning 'dirichlet:0.5' (this run: 'by-label')" in lines[0], again.stderr
