"""The master's update (pgc_mpi.learning.optim): built-in schedules, clipping, a user's optimizer
on views of the flat vector, their checks, and the state a checkpoint keeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from pgc_mpi.config import config_from_args
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.optim import FlatOptimizer, Recipe, make_update, schedule_factor


def test_the_built_in_schedules_by_formula():
    cosine = schedule_factor(Recipe(lr=1.0, lr_schedule="cosine", warmup_steps=4, min_lr=0.1, steps=14))
    assert [cosine(t) for t in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert cosine(4) == pytest.approx(1.0) and cosine(13) == pytest.approx(0.1)
    assert cosine(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 5 / 9)))
    linear = schedule_factor(Recipe(lr=2.0, lr_schedule="linear", min_lr=0.2, steps=11))
    assert linear(0) == 1.0 and linear(10) == pytest.approx(0.1) and linear(5) == pytest.approx(0.55)
    step = schedule_factor(Recipe(lr_schedule="step", lr_milestones=(3, 6), lr_gamma=0.5))
    assert [step(t) for t in range(8)] == [1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25]
    assert not Recipe().scheduled and Recipe(warmup_steps=1).scheduled


def test_clipping_uses_torchs_coefficient_and_reports_the_norm_before():
    w = np.zeros(4)
    opt = FlatOptimizer(w, Recipe(lr=1.0, clip_grad_norm=1.0))
    opt.grad[:] = [3.0, 4.0, 0.0, 0.0]
    out = opt.step()
    assert out == {"lr": 1.0, "grad_norm": 5.0}
    np.testing.assert_allclose(w, -np.array([3, 4, 0, 0]) * 1.0 / (5.0 + 1e-6))
    opt.grad[:] = [0.3, 0.4, 0.0, 0.0]  # under the limit: untouched
    before = w.copy()
    opt.step()
    np.testing.assert_allclose(w, before - [0.3, 0.4, 0, 0])


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2)).double()


def _groups(model: nn.Module) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    return torch.optim.SGD([{"params": decay, "weight_decay": 0.1, "lr": 0.2}, {"params": rest, "weight_decay": 0.0}],
                           lr=0.1, momentum=0.9)


def test_a_users_optimizer_steps_views_of_the_flat_vector():
    model = _model()
    w = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
    opt = FlatOptimizer(w, Recipe(), module=model, factory=_groups)
    assert not opt.flat and opt.lrs() == [0.2, 0.1]
    reference = _model()
    ref_opt = _groups(reference)
    rng = np.random.default_rng(0)
    for _ in range(3):
        g = rng.standard_normal(len(w))
        opt.grad[:] = g
        record = opt.step()
        offset = 0
        for p in reference.parameters():
            p.grad = torch.from_numpy(g[offset:offset + p.numel()].reshape(p.shape).copy())
            offset += p.numel()
        ref_opt.step()
    assert record["lr_groups"] == [0.2, 0.1]
    np.testing.assert_allclose(w, torch.cat([p.detach().reshape(-1) for p in reference.parameters()]).numpy())


def test_a_users_optimizer_and_schedule_come_back_exactly_from_their_blobs():
    def make() -> tuple[np.ndarray, FlatOptimizer]:
        model = _model()
        w = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
        return w, FlatOptimizer(w, Recipe(), module=model, factory=_groups,
                                scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 2, gamma=0.5))

    w, opt = make()
    for k in range(3):
        opt.grad[:] = k + 1.0
        opt.step()
    blobs = opt.state_blobs()
    w2, opt2 = make()
    w2[:] = w
    assert "optimizer and schedule state" in opt2.restore(None, blobs, "ckpt")
    for o in (opt, opt2):
        o.grad[:] = 0.5
        o.step()
    np.testing.assert_array_equal(w, w2)
    assert opt.lrs() == opt2.lrs()


def test_a_built_in_at_a_constant_rate_takes_the_flags_on_resume():
    w = np.zeros(3)
    opt = FlatOptimizer(w, Recipe(optimizer="momentum", lr=0.5))
    opt.grad[:] = 1.0
    opt.step()
    resumed = FlatOptimizer(np.zeros(3), Recipe(optimizer="momentum", lr=0.1, momentum=0.5))
    said = resumed.restore(opt.opt.state_dict(), {}, "ckpt")
    assert resumed.lrs() == [0.1] and "from the flags (lr 0.5 -> 0.1, momentum 0.9 -> 0.5)" in said


FACTORIES = '''
import torch


def returns_text(model):
    return "sgd"


def foreign(model):
    return torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)


def broken(model):
    raise ValueError("no such group")


def other_optimizer(opt):
    return torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1), 5)


def not_a_scheduler(opt):
    return 3
'''


@pytest.mark.parametrize("flags,message", [
    (["--optimizer", "{f}:returns_text"], "returned str, not a torch.optim.Optimizer"),
    (["--optimizer", "{f}:foreign"], "optimizes 1 tensors that are not the model's parameters"),
    (["--optimizer", "{f}:broken"], "optimizer factory {f}:broken failed: ValueError: no such group"),
    (["--scheduler", "{f}:other_optimizer"], "built its scheduler on another optimizer"),
    (["--scheduler", "{f}:not_a_scheduler"], "returned int, not a torch LRScheduler"),
])
def test_bad_factories_are_one_line(tmp_path, flags, message):
    factories = tmp_path / "factories.py"
    factories.write_text(FACTORIES)
    cfg = config_from_args([flag.format(f=factories) for flag in flags])
    model = _model()
    w = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
    problem = type("Problem", (), {"module": model})()
    with pytest.raises(ConfigError) as caught:
        make_update(cfg, w, problem)
    assert message.format(f=factories) in str(caught.value) and "\n" not in str(caught.value)


def test_a_users_optimizer_needs_a_model():
    with pytest.raises(ConfigError, match="needs a torch model"):
        FlatOptimizer(np.zeros(3), Recipe(), factory=_groups)
