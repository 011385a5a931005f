"""Optimizer factories for benchmarks/recipe_time_to_accuracy.py, passed to pgc-train as
`--optimizer benchmarks/recipe_factories.py:NAME` (and called the same way by its plain torch loop).

A factory takes the model (on pgc-train's master: a copy whose parameters view the flat vector)
and returns a torch.optim.Optimizer over its parameters; the factory sets the learning rate.
"""

from __future__ import annotations

import torch
from torch import nn

LR = 0.1
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on the weights only (tensors of ndim > 1: conv kernels, linear matrices), none
    on biases (and norms' scales and shifts, had the model any)."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]


def nesterov_wd(model: nn.Module) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum 0.9, lr 0.1, weight decay 5e-4 on the weights only."""
    return torch.optim.SGD(param_groups(model, WEIGHT_DECAY), lr=LR, momentum=MOMENTUM, nesterov=True)
