"""Plug-ins for the command line: your model, loss and data by PATH:NAME, no script needed.

    mpiexec -n 5 pgc-train --model examples/nets.py:make_model --loss examples/nets.py:focal_loss \
        --dataset examples/nets.py:digits --scheme pgc-cr -s 1 --steps 300 --lr 0.3
    pgc-sim --model examples/nets.py:make_model --loss examples/nets.py:focal_loss \
        --dataset examples/nets.py:digits -n 4 --schemes dgd,gc-cr,pgc-cr --steps 100
    sbatch -n 5 launch/slurm/train.sbatch --model examples/nets.py:make_model --dataset examples/nets.py:digits

Every rank imports this file (it must be readable on every node).
"""

import torch
from sklearn.datasets import load_digits
from torch import nn


def make_model() -> nn.Module:
    """A small CNN for 8x8 digits (zero arguments: every rank calls it)."""
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16 * 4 * 4, 10))


def focal_loss(output, target, gamma: float = 2.0):
    """Focal loss (Lin et al., 2017), the mean over the minibatch."""
    log_p = torch.log_softmax(output, dim=1).gather(1, target[:, None]).squeeze(1)
    return (-((1 - log_p.exp()) ** gamma) * log_p).mean()


def digits():
    """(train, test) pairs of (x, y) arrays: scikit-learn's digits, 1500 to train on."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype("float32").reshape(-1, 1, 8, 8)
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])
