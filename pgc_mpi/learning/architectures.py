"""The built-in models by name (--model logreg, linear, mlp, cnn, resnet18): build_model, which
pgc-train's ranks call and users call to load an exported state_dict (pgc-export) into."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..choices import MODELS
from ..errors import ConfigError


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for small images (CIFAR variant: 3x3 stem, no max-pool); ~11.2M parameters."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def build_model(name: str, sample_shape: tuple[int, ...], outputs: int) -> nn.Module:
    """A fresh model by name for inputs of `sample_shape` and `outputs` logits (1 for regression)."""
    features = int(np.prod(sample_shape))
    if name in ("logreg", "linear"):
        return nn.Sequential(nn.Flatten(), nn.Linear(features, outputs))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(features, 128), nn.ReLU(), nn.Linear(128, outputs))
    if name in ("cnn", "resnet18") and len(sample_shape) != 3:
        raise ConfigError(f"model {name!r} needs image samples [channels, height, width], got shape "
                          f"{list(sample_shape)}: use logreg or mlp for this data set")
    if name == "cnn":  # LeNet-style; two 2x poolings, so 8x8, 28x28 and 32x32 inputs all fit
        c, h, w = sample_shape
        return nn.Sequential(
            nn.Conv2d(c, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * (h // 4) * (w // 4), 128), nn.ReLU(), nn.Linear(128, outputs),
        )
    if name == "resnet18":
        return ResNet18(sample_shape[0], outputs)
    raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
