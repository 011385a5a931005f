"""--partitioning in the simulator: pgc-sim trains on partitions cut by class, its records say so,
and simulate() refuses a problem cut otherwise than its configuration says."""

from __future__ import annotations

import json

import pytest

from pgc_mpi.config import SimConfig
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.torch_problem import load_problem
from pgc_mpi.sim.cli import main as sim_main
from pgc_mpi.sim.simulator import simulate


def test_pgc_sim_trains_on_partitions_cut_by_label_and_its_records_say_so(capsys, tmp_path):
    out = tmp_path / "r.jsonl"
    args = ["--model", "logreg", "--dataset", "digits", "-n", "10", "--steps", "30", "--eval-every", "10",
            "--schemes", "pgc-cr", "--partitioning", "by-label", "--out", str(out)]
    assert sim_main(args) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "--partitioning by-label" in head
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records and all(r["partitioning"] == "by-label" for r in records)
    evals = [r for r in records if r.get("event") == "eval"]
    assert evals[-1]["train_loss"] < 0.8 * 2.302  # it trained (ln 10 at the start)


def test_simulate_refuses_a_problem_cut_otherwise():
    problem = load_problem("digits", "logreg", 4, 16, seed=0, partitioning="by-label")
    assert problem.partitioning == "by-label"
    with pytest.raises(ConfigError, match=r"^--partitioning dirichlet:0.5: the problem given was cut by-label"):
        simulate(SimConfig(workers=4, scheme="dgd", steps=1, partitioning="dirichlet:0.5"), problem)


def test_pgc_sim_refuses_by_label_on_a_synthetic_problem(capsys):
    assert sim_main(["--problem", "least-squares", "--partitioning", "by-label", "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("pgc-sim: error: --partitioning by-label cuts the training data by class and needs a "
                   "classification data set (integer labels); the synthetic --problem least-squares has none: use "
                   "--partitioning iid")
