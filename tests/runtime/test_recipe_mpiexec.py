"""The training recipe under mpiexec (bounded): the user's optimizer, schedules, clipping and
accumulation against a plain torch loop, their resume, the lr in every step record, callbacks
that stop a run, and the checks of bad recipes."""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers import events_of, run_mpi, run_train, start_train, steps_of

# A small problem whose dgd update, with whole-partition minibatches in float64, is a full-batch
# gradient step: 96 samples in 4 partitions of 24, the mean of the partitions' means.
PARITY_SCRIPT = '''
import sys

import numpy as np
import torch
from torch import nn

import pgc_mpi

STEPS = 30


def make_model():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.LayerNorm(16), nn.Linear(16, 3))


def sgd_groups(model):  # a ResNet's recipe: nesterov, weight decay on the weights only
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    return torch.optim.SGD([{"params": decay, "weight_decay": 5e-3}, {"params": rest, "weight_decay": 0.0}],
                           lr=0.3, momentum=0.9, nesterov=True)


def warmup_cosine(opt):
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.2, total_iters=5)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS - 5, eta_min=0.01)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[5])


def adamw_lr(t):  # the built-in schedule --lr 0.01 --warmup-steps 5 --lr-schedule linear --min-lr 0.001
    return 0.01 * (t + 1) / 5 if t < 5 else 0.01 - (0.01 - 0.001) * (t - 5) / (STEPS - 1 - 5)


rng = np.random.default_rng(3)
x, y = rng.standard_normal((96, 8)), rng.integers(0, 3, 96)
case, out = sys.argv[1], sys.argv[2]
if case == "sgd":
    recipe = dict(optimizer=sgd_groups, scheduler=warmup_cosine, clip_grad_norm=0.5)
else:
    recipe = dict(optimizer="adamw", lr=0.01, weight_decay=0.05, warmup_steps=5, lr_schedule="linear", min_lr=0.001,
                  clip_grad_norm=1.0)
result = pgc_mpi.fit(make_model, (x, y), scheme="dgd", steps=STEPS, batch_size=24, dtype="float64", eval_every=10,
                     out=out, **recipe)
if result is not None:
    torch.manual_seed(0)  # fit seeds every rank with --seed (0) before building the model
    model = make_model().double()
    if case == "sgd":
        opt, schedule = sgd_groups(model), None
        sched = warmup_cosine(opt)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
        sched, schedule = None, adamw_lr
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    lrs = []
    for t in range(STEPS):
        if schedule is not None:
            for group in opt.param_groups:
                group["lr"] = schedule(t)
        lrs.append(opt.param_groups[0]["lr"])
        opt.zero_grad()
        nn.functional.cross_entropy(model(xt), yt).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["clip_grad_norm"])
        opt.step()
        if sched is not None:
            sched.step()
    reference = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(out + "/reference.npy", reference)
    np.save(out + "/reference_lr.npy", np.array(lrs))
    np.save(out + "/trained.npy", result.params)
    torch.manual_seed(0)
    np.save(out + "/initial.npy", torch.cat([p.detach().reshape(-1) for p in make_model().double().parameters()]))
'''


@pytest.mark.parametrize("case", ["sgd", "adamw"])
def test_dgd_with_a_recipe_follows_a_plain_torch_loop(tmp_path, case):
    script = tmp_path / "parity.py"
    script.write_text(PARITY_SCRIPT)
    out = tmp_path / "run"
    proc = run_mpi(5, [str(script), case, str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained, reference = np.load(out / "trained.npy"), np.load(out / "reference.npy")
    assert np.max(np.abs(trained - reference)) <= 1e-9
    assert np.max(np.abs(trained - np.load(out / "initial.npy"))) > 1e-3  # it trained
    steps = steps_of(out)
    np.testing.assert_allclose([r["lr"] for r in steps], np.load(out / "reference_lr.npy"), rtol=1e-12)
    assert all(r["grad_norm"] > 0 for r in steps)
    if case == "sgd":  # two param groups, one learning rate: no per-group list
        assert "lr_groups" not in steps[0]


def _lrs(out: Path) -> list[float]:
    return [r["lr"] for r in steps_of(out)]


def test_the_cli_step_schedule_is_in_every_step_record(tmp_path):
    out = tmp_path / "run"
    proc = run_train(4, ["--scheme", "pgc-cr", "--steps", "14", "--lr", "0.2", "--optimizer", "momentum",
                         "--lr-schedule", "step", "--lr-milestones", "5,10", "--lr-gamma", "0.5",
                         "--warmup-steps", "2", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _lrs(out) == pytest.approx([0.1, 0.2, 0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05])


def test_sharded_servers_follow_rank_0s_schedule(tmp_path):
    """--servers 2: the followers step their shards with the learning rate rank 0 commits each
    step (they have no schedule of their own): the same trajectory as one server."""
    common = ["--scheme", "dgd", "--steps", "16", "--lr", "0.3", "--optimizer", "nesterov", "--lr-schedule",
              "cosine", "--warmup-steps", "4", "--dtype", "float64", "--record-params"]
    runs = []
    for servers in (1, 2):
        out = tmp_path / f"servers{servers}"
        proc = run_train(3 + servers, [*common, "--servers", str(servers), "--out", str(out)])
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(out)
    np.testing.assert_allclose(np.load(runs[1] / "params.npy"), np.load(runs[0] / "params.npy"), atol=1e-12)
    assert _lrs(runs[1]) == pytest.approx(_lrs(runs[0]))
    assert "grad_norm" in steps_of(runs[0])[0] and "grad_norm" not in steps_of(runs[1])[0]


def test_a_scheduled_clipped_run_resumes_to_the_same_parameters(tmp_path):
    """Stopped by a signal and resumed (on the same n, and a copy of it on another n): the
    optimizer's and the schedule's state come back exactly, so dgd ends where an uninterrupted run
    ends, and the elastic resume follows the same schedule."""
    common = ["--scheme", "dgd", "--steps", "40", "--lr", "0.3", "--optimizer", "nesterov", "--weight-decay",
              "1e-3", "--lr-schedule", "cosine", "--warmup-steps", "6", "--min-lr", "0.01", "--clip-grad-norm",
              "0.5", "--dtype", "float64", "--checkpoint-every", "5", "--compute-time", "0.02"]
    whole = tmp_path / "whole"
    assert run_train(4, [*common, "--out", str(whole)]).returncode == 0
    cut = tmp_path / "cut"
    proc = start_train(4, common, cut)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr[-3000:]
    assert events_of(cut, "summary")[-1]["steps"] < 40
    elastic = tmp_path / "elastic"
    shutil.copytree(cut, elastic)
    proc = run_train(4, [*common, "--resume", "auto", "--out", str(cut)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "optimizer and schedule state" in proc.stderr
    assert _lrs(cut) == pytest.approx(_lrs(whole), rel=1e-12)

    def final(out: Path) -> np.ndarray:
        with h5py.File(out / "checkpoints" / "ckpt-00000040.h5") as f:
            return f["params"][...]

    np.testing.assert_allclose(final(cut), final(whole), rtol=0, atol=1e-12)
    proc = run_train(5, [*common, "--resume", "auto", "--out", str(elastic)])  # 4 workers instead of 3
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _lrs(elastic) == pytest.approx(_lrs(whole), rel=1e-12)


CALLBACK_SCRIPT = '''
from sklearn.datasets import load_digits

import pgc_mpi


class StopAtStep:
    def __init__(self, step):
        self.step, self.seen = step, []

    def on_step(self, record):
        self.seen.append(record["step"])
        return record["step"] == self.step

    def on_end(self, summary):
        print("callback saw", len(self.seen), "steps; summary", summary["stopped_by"])


x, y = load_digits(return_X_y=True)
x = (x / 16).astype("float32")
options = pgc_mpi.options_from_args(scheme="pgc-cr", steps=100, lr=0.2, eval_every=5)
pgc_mpi.fit("logreg", (x, y), callbacks=[StopAtStep(7)], **options)
'''


def test_a_callback_stops_a_run_with_a_checkpoint_and_resume_auto_leaves_it_finished(tmp_path):
    script = tmp_path / "stop.py"
    script.write_text(CALLBACK_SCRIPT)
    out = tmp_path / "run"
    proc = run_mpi(4, [str(script), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = events_of(out, "summary")[-1]
    assert summary["stopped_by"] == "callback" and summary["steps"] == 8
    assert "callback saw 8 steps; summary callback" in proc.stdout
    assert (out / "checkpoints" / "ckpt-00000008.h5").exists()
    again = run_mpi(4, [str(script), "--out", str(out), "--resume", "auto"])
    assert again.returncode == 2
    assert "a callback stopped after step 8" in again.stderr


def test_early_stopping_keep_best_and_export_from_the_command_line(tmp_path):
    tensorboard = importlib.util.find_spec("tensorboard") is not None  # the [tensorboard] extra (CI has it)
    out = tmp_path / "run"
    csv = tmp_path / "evals.csv"
    # train_accuracy rises while training: in "min" mode it never improves, so patience 2 stops it
    proc = run_train(5, ["--scheme", "pgc-fr", "--steps", "200", "--lr", "0.2", "--eval-every", "5",
                         "--early-stop", "train_accuracy:2:min", "--keep-best", "test_accuracy", "--csv-log", str(csv),
                         *(["--tensorboard", str(tmp_path / "tb")] if tensorboard else []), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = events_of(out, "summary")[-1]
    assert summary["stopped_by"] == "callback" and summary["steps"] == 15
    assert (out / "checkpoints" / "best.h5").exists()
    assert len(csv.read_text().splitlines()) == 1 + 3  # the header and the three evaluations
    assert not tensorboard or list((tmp_path / "tb").glob("events.out.tfevents.*"))
    model_pt = tmp_path / "model.pt"
    export = run_mpi(1, ["-m", "pgc_mpi.commands.export", str(out), "--checkpoint", "best", "--out", str(model_pt)])
    assert export.returncode == 0, export.stderr
    import torch

    from pgc_mpi import build_model

    model = build_model("logreg", (64,), 10)
    model.load_state_dict(torch.load(model_pt))


FACTORY_FILE = '''
import torch


def not_an_optimizer(model):
    return "sgd"


def other_optimizer(opt):
    return torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1), 5)
'''


@pytest.mark.parametrize("flags,message", [
    (["--optimizer", "{f}:not_an_optimizer"], "returned str, not a torch.optim.Optimizer"),
])
def test_bad_factories_are_one_line_before_training(tmp_path, flags, message):
    """rank 0 builds the update before training: a factory's mistake is pgc-train's one line, exit
    status 2 on every rank (the other checks of factories: tests/learning/test_optim.py)."""
    factories = tmp_path / "factories.py"
    factories.write_text(FACTORY_FILE)
    flags = [flag.format(f=factories) for flag in flags]
    proc = run_train(3, [*flags, "--steps", "5", "--out", str(tmp_path / "run")])
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]


def test_accumulation_and_bf16_keep_decoding_exact(tmp_path):
    """gc-cr decodes exactly only if the holders of a partition send the same gradient: with
    micro-batches and bf16 autocast they still do (the decode residual stays at rounding)."""
    out = tmp_path / "run"
    proc = run_train(5, ["--scheme", "gc-cr", "-s", "1", "--steps", "12", "--accumulate", "3", "--batch-size", "8",
                         "--autocast", "bf16", "--model", "mlp", "--dtype", "float64", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = steps_of(out)
    assert len(steps) == 12 and all(r["residual"] < 1e-9 for r in steps), [r["residual"] for r in steps]
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["accumulate"] == 3 and config["autocast"] == "bf16"


def test_the_recipe_example_runs_and_resumes(tmp_path):
    """examples/recipe.py: a user's optimizer with two param groups, a user's schedule, callbacks;
    resumed with more steps, their state comes back from the checkpoint (the CSV log goes on)."""
    out = tmp_path / "run"
    example = str(Path(__file__).resolve().parents[2] / "examples" / "recipe.py")
    proc = run_mpi(5, [example, "--steps", "30", "--eval-every", "10", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "test accuracy" in proc.stdout and (out / "model.pt").exists() and (out / "checkpoints" / "best.h5").exists()
    proc = run_mpi(5, [example, "--steps", "40", "--eval-every", "10", "--out", str(out), "--resume", "auto"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "optimizer and schedule state from the checkpoint" in proc.stderr
    assert [r["step"] for r in steps_of(out)] == list(range(40))
    assert [line.split(",")[0] for line in (out / "evals.csv").read_text().splitlines()[1:]] == ["9", "19", "29", "39"]
