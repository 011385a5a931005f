"""The master's update: a torch optimizer stepping a flat parameter vector in place."""

from __future__ import annotations

import numpy as np
import torch

from ..choices import OPTIMIZERS
from ..errors import ConfigError


class FlatOptimizer:
    """Applies g_hat to the flat parameters `w` (a NumPy array, updated in place).

    The torch parameter and its .grad are views of `w` and of an internal gradient buffer,
    so a step moves no bytes between NumPy and torch.
    """

    def __init__(self, w: np.ndarray, name: str = "sgd", lr: float = 0.1, momentum: float = 0.9,
                 weight_decay: float = 0.0):
        if name not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")
        if not lr > 0:
            raise ConfigError(f"the learning rate must be > 0, got {lr}")
        self.w = w
        self.param = torch.nn.Parameter(torch.from_numpy(w), requires_grad=False)
        self._grad = np.zeros_like(w)
        self.param.grad = torch.from_numpy(self._grad)
        if name == "adam":
            self.opt: torch.optim.Optimizer = torch.optim.Adam([self.param], lr=lr, weight_decay=weight_decay)
        else:
            self.opt = torch.optim.SGD([self.param], lr=lr, weight_decay=weight_decay,
                                       momentum=momentum if name == "momentum" else 0.0)

    @property
    def grad(self) -> np.ndarray:
        """The buffer the decoded gradient is written into before step()."""
        return self._grad

    @torch.no_grad()
    def step(self) -> None:
        """w <- optimizer(w, grad), in place."""
        self.opt.step()
