"""A user's recipe for benchmarks/advise_vs_mpi.py's `recipe` situation, passed to pgc-train and
pgc-advise as `--optimizer benchmarks/advise_factories.py:momentum_sgd` and
`--scheduler benchmarks/advise_factories.py:step_decay`: plug-ins, not built-in recipes, so the
advice must simulate the user's own factories.
"""

from __future__ import annotations

import torch
from torch import nn


def momentum_sgd(model: nn.Module) -> torch.optim.Optimizer:
    """Heavy-ball SGD, lr 0.2, momentum 0.8 (an effective step of 1.0, the plain runs' lr)."""
    return torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.8)


def step_decay(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """The rate halved every 40 steps."""
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=40, gamma=0.5)
