"""A torch Dataset with a random transform, trained with gc-cr (s=1) on 4 workers.

    mpiexec -n 5 python examples/dataset_transform.py [pgc-train flags]

pgc-mpi reads a Dataset one minibatch at a time, on the workers that store its partition. It
seeds torch's generator from (seed, partition, draw) before each minibatch, so the random shift
below is the same on both workers that hold a partition: gradient coding still decodes exactly.
"""

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import Dataset

import pgc_mpi


class ShiftedDigits(Dataset):
    """8x8 digits, each read shifted by up to one pixel (with `augment`)."""

    def __init__(self, x, y, augment: bool):
        self.x, self.y, self.augment = torch.tensor(x / 16, dtype=torch.float32).reshape(-1, 1, 8, 8), y, augment

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        image = self.x[i]
        if self.augment:
            dy, dx = torch.randint(-1, 2, (2,)).tolist()
            image = torch.roll(image, shifts=(dy, dx), dims=(1, 2))
        return image, int(self.y[i])


def make_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))


x, y = load_digits(return_X_y=True)
options = pgc_mpi.options_from_args(scheme="gc-cr", stragglers=1, steps=200, lr=0.3, out="runs/dataset-transform")
result = pgc_mpi.fit(make_model, ShiftedDigits(x[:1500], y[:1500], augment=True),
                     test_data=ShiftedDigits(x[1500:], y[1500:], augment=False), **options)
if result is not None:
    print(f"test accuracy {result.summary['final_test_accuracy']:.3f}, outputs in {result.out}")
