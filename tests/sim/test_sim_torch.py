"""The simulator on pgc-train's torch models and data sets: the CLI, evaluation cadence, lazy
payloads, replay, and the options that choose the problem."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pgc_mpi.config import SimConfig
from pgc_mpi.core.message import MessageRecord
from pgc_mpi.learning.torch_problem import TorchProblem, load_problem
from pgc_mpi.sim.cli import main as sim_main
from pgc_mpi.sim.replaying import replay
from pgc_mpi.sim.simulator import SimWorkers, simulate

TORCH_ARGS = ["--model", "logreg", "--dataset", "digits", "-n", "6", "--steps", "30", "--eval-every", "5"]


@pytest.fixture(scope="module")
def digits6() -> TorchProblem:
    return load_problem("digits", "logreg", 6, 16, seed=3, dtype="float64")


class CountingProblem:
    """A problem that counts its gradient computations (loss_and_grad, the simulator's one call);
    everything else is the wrapped problem's."""

    def __init__(self, problem: TorchProblem):
        self.problem, self.calls = problem, 0

    def __getattr__(self, name: str):
        return getattr(self.problem, name)

    def loss_and_grad(self, w: np.ndarray, partition: int, draw: int) -> tuple[float, np.ndarray]:
        self.calls += 1
        return self.problem.loss_and_grad(w, partition, draw)


def test_pgc_sim_runs_a_torch_model_to_a_target_loss_deterministically(capsys, tmp_path):
    args = [*TORCH_ARGS, "--schemes", "dgd,pgc-cr,pbs", "--target-loss", "1.2", "--out", str(tmp_path / "r.jsonl")]
    assert sim_main(args) == 0
    first = capsys.readouterr().out
    assert sim_main(args) == 0
    assert capsys.readouterr().out == first  # the same delays, gradients and evaluations
    head, columns, *rows = first.splitlines()
    assert head.startswith("target training loss 1.2 (on the whole training set), evaluated every 5 steps")
    assert "steps to loss" in columns and "steps, decoded rule" in columns and "time to loss" in columns
    assert "test acc" in columns
    assert len(rows) == 3 and all(" 1/1 " in row for row in rows)
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    evaluated = [r["step"] for r in records if r["scheme"] == "pgc-cr" and r.get("event") == "eval"]
    assert evaluated == [4, 9, 14, 19, 24, 29]  # every 5 steps; the last step is one of them
    steps_to_loss = float(rows[1].split()[2])
    assert steps_to_loss % 5 == 0  # a target can only be seen at an evaluation


def test_evaluations_are_records_of_their_own_and_steps_carry_the_decoded_loss(digits6):
    """As in pgc-train's metrics: every step record's train_loss is the mean minibatch loss of the
    messages the master used; the full-set evaluations (every eval_every steps and after the
    last) are separate records, and the target is checked on them only."""
    cfg = SimConfig(scheme="pgc-cr", workers=6, stragglers=1, steps=10, delay="exp:1.0", seed=3, eval_every=4)
    res = simulate(cfg, digits6)
    assert [e["step"] for e in res.evals] == [3, 7, 9]  # and after the last step
    assert [e["wall_time"] for e in res.evals] == [res.records[k]["wall_time"] for k in (3, 7, 9)]
    assert all("test_loss" not in r and math.isfinite(r["train_loss"]) for r in res.records)
    step = res.records[5]  # its loss is the mean of the used messages' fresh minibatch losses
    scheme = cfg.make_scheme(6)
    w5 = simulate(SimConfig(**{**cfg.__dict__, "steps": 5}), digits6).params
    expected = [np.mean([digits6.loss_and_grad(w5, scheme.placement[i][k], scheme.draw_index(5, k))[0]
                         for k in scheme.fresh_slots(5, i)]) for i in step["used"]]
    assert step["train_loss"] == pytest.approx(float(np.mean(expected)), rel=1e-12)
    assert res.loss_key == "train_loss"
    target = res.evals[1]["train_loss"]
    assert res.first_below("train_loss", target)["step"] in (3, 7)  # never a step without an evaluation
    assert res.final("train_loss") == res.evals[-1]["train_loss"]
    stopped = simulate(SimConfig(**{**cfg.__dict__, "target_loss": target}), digits6)
    assert stopped.records[-1]["step"] == res.first_below("train_loss", target)["step"]


def test_a_stalled_run_is_evaluated_where_it_stopped(digits6):
    cfg = SimConfig(scheme="dgd", workers=6, stragglers=1, steps=20, delay="hang:2@5", eval_every=4)
    res = simulate(cfg, digits6)
    assert res.stalled is not None and len(res.records) == 5
    assert [e["step"] for e in res.evals] == [3, 4]


def test_without_the_training_split_the_target_is_the_test_loss(capsys):
    assert sim_main([*TORCH_ARGS, "--schemes", "pgc-cr", "--no-eval-train", "--target-loss", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("target test loss 5 (on the test set, --no-eval-train)")
    assert " 1/1 " in out.splitlines()[2]


def _eager(finish):
    """SimWorkers.finish computing every payload at once, as the simulator did before."""
    def finish_eagerly(self):
        at, job, msg, payload, loss = finish(self)
        value = payload()
        return at, job, msg, lambda: value, loss
    return finish_eagerly


@pytest.mark.parametrize("scheme", ["pgc-cr", "is-sgd", "pbs"])
def test_late_messages_cost_no_gradient(digits6, scheme, monkeypatch):
    """Worker 2 is 2.5 s slow at every step: its messages are late (pbs: older than the table's
    entry), are counted and dropped, and their payloads are never computed."""
    problem = CountingProblem(digits6)
    cfg = SimConfig(scheme=scheme, workers=6, stragglers=1, steps=20, delay="fixed:2:2.5", seed=1, eval_every=20)
    res = simulate(cfg, problem)
    messages = [MessageRecord._make(m) for r in res.records for m in r["messages"]]
    assert sum(m.verdict in ("late", "stale") for m in messages) > 0
    if scheme == "pbs":  # one gradient per message that replaced a table entry, none for the others
        assert problem.calls == sum(m.verdict == "used" for m in messages)
    else:
        coded = cfg.make_scheme(6)
        needed = {(coded.placement[i][k], v, coded.draw_index(v, k))  # the gradients of the used messages
                  for r in res.records for i in r["used"] for k, v in enumerate(r["versions"][i])}
        assert problem.calls == len(needed)
    monkeypatch.setattr(SimWorkers, "finish", _eager(SimWorkers.finish))
    eager = CountingProblem(digits6)
    again = simulate(cfg, eager)
    assert eager.calls > problem.calls  # the same run, but the late messages' gradients computed too
    assert again.evals == res.evals and [r["train_loss"] for r in again.records] == \
        [r["train_loss"] for r in res.records]


@pytest.mark.parametrize("scheme", ["pgc-cr", "gc-cr"])
def test_replay_reproduces_a_simulated_torch_run(digits6, scheme):
    cfg = SimConfig(scheme=scheme, workers=6, stragglers=1, steps=15, lr=0.5, delay="exp:1.0", seed=3, eval_every=5)
    res = simulate(cfg, digits6, record_params=True)
    fresh = load_problem("digits", "logreg", 6, 16, seed=3, dtype="float64")  # the same problem, built again
    again = replay(cfg.make_scheme(6), fresh, res.records, lr=0.5)
    assert len(again) == len(res.trajectory) == 16
    assert all(np.array_equal(x, y) for x, y in zip(again, res.trajectory))
    assert np.abs(res.trajectory[-1] - res.trajectory[0]).max() > 1e-3  # it did train


@pytest.mark.parametrize("args,message", [
    (["--problem", "logistic", "--dataset", "digits"], "--problem (a synthetic problem) and --dataset (a torch"),
    (["--samples", "100", "--model", "logreg"], "exclude each other"),
    (["--model", "logreg", "--target-gap", "0.1"], "--target-gap needs a known optimum"),
    (["--target-gap", "0.1", "--target-loss", "1"], "--target-gap and --target-loss exclude each other"),
    (["--dtype", "float64"], "--dtype applies only to a torch problem"),
    (["--no-verify-data", "--no-eval-train"], "--no-eval-train and --no-verify-data apply only to a torch problem"),
    (["--model", "nope"], "--model 'nope' is neither a built-in model (logreg"),
    (["--model", "logreg", "--dtype", "float16"], "--dtype 'float16' is not one of"),
    (["--model", "logreg", "--threads", "0"], "--threads must be a positive integer"),
    (["--model", "logreg", "--eval-every", "0"], "--eval-every must be a positive integer"),
    (["--model", "logreg", "--target-loss", "nan"], "--target-loss must be a finite number"),
    (["--dataset", "nope.h5"], "--dataset nope.h5: no such data file"),
    (["--dataset", "digits", "-n", "2000", "-s", "1"], "fewer than the 2000 partitions"),
])
def test_bad_combinations_are_one_line_errors(args, message, capsys):
    assert sim_main([*args, "--steps", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    errors = [line for line in err if line.startswith("pgc-sim: error: ")]
    assert len(errors) == 1 and message in errors[0], err
    assert all(line.startswith(("pgc-sim: error: ", "built ", "simulated ")) for line in err), err


def test_a_combination_error_imports_no_torch():
    probe = textwrap.dedent("""
        import sys
        from pgc_mpi.sim.cli import main
        assert main(["--problem", "logistic", "--model", "mlp"]) == 2
        assert main(["--dtype", "float64"]) == 2
        print("torch" in sys.modules)
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"
