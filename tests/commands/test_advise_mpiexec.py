"""pgc-advise on real probes: short pgc-train runs under mpiexec (bounded), then the advice on them.

A synthetic-problem probe (dgd, 4 workers, 20 ms per gradient, exp(50 ms) delays, 50 steps, about
10 s) and a torch one (logreg on digits, the same cluster), each advised on a few candidates: the
printed table and --json agree, the recommendation is the rule's, and the trace replay gives back
the probe's own step times."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_advise import assert_agree, train_probe

from pgc_mpi.commands.advise import main
from pgc_mpi.runs.probe import read_probe
from pgc_mpi.runs.results import read_steps

from helpers import run_train


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return train_probe(tmp_path_factory.mktemp("advise-mpi") / "probe")


def test_a_synthetic_probe_is_advised_and_the_table_agrees_with_json(synthetic, capsys, tmp_path):
    config = json.loads((synthetic / "config.json").read_text())
    assert config["provenance"]["program"] == "pgc-train"
    probe = read_probe(synthetic)
    assert set(probe.master) == {"receive", "decode", "update", "send"} and probe.master["update"] > 0
    assert probe.compute_time() == pytest.approx(0.02, rel=0.05)
    argv = [str(synthetic), "--target-loss", "0.005", "--schemes", "dgd,is-sgd,pgc-fr,pgc-cr,pbs", "--s", "1",
            "--seeds", "2"]
    assert main([*argv, "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert_agree(advice, capsys.readouterr().out)
    assert advice["master_cost"] == "the probe's measured times"  # its file went with the temporary folder
    assert advice["delays"]["steps"] == 45 and advice["delays"]["mean"] == pytest.approx(0.05, rel=0.3)
    # 5 schemes, and is-sgd, pgc-fr and pgc-cr also with --abandon-late (dgd's --drop-compute needs micro-batches),
    # pgc-fr and pgc-cr with --max-staleness none and with --staleness-correction none
    assert (tmp_path / "advice.csv").read_text().count("\n") == 1 + 5 + 3 + 4


def test_the_trace_replay_gives_the_probes_step_times_back(synthetic, tmp_path):
    """dgd replayed on its own probe's trace (seed 0: the measured steps in order), with the
    probe's compute and master times: the same step times, within a few percent."""
    import dataclasses

    from pgc_mpi.sim import advice
    from pgc_mpi.sim.simulator import simulate

    probe = read_probe(synthetic)
    target = advice.Target("loss", -1.0)  # never reached: every step runs
    base = advice.base_options(probe, 45, 1000, probe.compute_time(), advice.master_cost(probe, tmp_path), target)
    cfg = advice.plan(["dgd"], [1], base)[0][advice.Candidate("dgd", None)]
    delays = advice.replay(probe, "trace", 45, 1, tmp_path)
    res = simulate(dataclasses.replace(cfg, delay=delays.spec(0, cfg)), advice.problem_choice(probe).build(4, 0))
    simulated = np.array([r["step_time"] for r in res.records])
    measured = np.array([r["step_time"] for r in read_steps(synthetic)][5:])
    assert np.median(simulated) == pytest.approx(np.median(measured), rel=0.05)
    assert np.corrcoef(simulated, measured)[0, 1] > 0.9


def test_a_torch_probe_end_to_end(capsys, tmp_path):
    out = tmp_path / "digits"
    proc = run_train(5, ["--scheme", "dgd", "--steps", "45", "--compute-time", "0.02", "--delay", "exp:0.05",
                         "--eval-every", "15", "--out", str(out)], timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    argv = [str(out), "--target-loss", "0.8", "--schemes", "dgd,pgc-cr", "--s", "1", "--seeds", "2",
            "--max-steps", "120", "--eval-every", "10"]
    assert main([*argv, "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    assert_agree(advice, capsys.readouterr().out)
    assert advice["probe"]["problem"] == "logreg on digits"
    assert all(r["final_loss"] <= 0.8 for r in advice["candidates"] if r["reached"] == r["seeds"])
