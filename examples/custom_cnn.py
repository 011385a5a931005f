"""Your own CNN and loss on NumPy arrays, trained with pgc-cr (s=1) on 4 workers.

    mpiexec -n 5 python examples/custom_cnn.py                  # Ctrl-C: a checkpoint, exit status 3
    mpiexec -n 5 python examples/custom_cnn.py --resume auto    # continues where it stopped

Any pgc-train flag on the command line overrides the options below (--steps 50, --scheme gc-cr, ...).
"""

from sklearn.datasets import load_digits
from torch import nn

import pgc_mpi


def make_model() -> nn.Module:  # every rank builds it; rank 0's initial weights are trained
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16 * 4 * 4, 10))


def smoothed_cross_entropy(output, target):  # the mean over the minibatch, as every loss must be
    return nn.functional.cross_entropy(output, target, label_smoothing=0.1)


x, y = load_digits(return_X_y=True)
x = (x / 16).astype("float32").reshape(-1, 1, 8, 8)
options = pgc_mpi.options_from_args(scheme="pgc-cr", stragglers=1, steps=300, lr=0.3, checkpoint_every=50,
                                    delay="exp:0.01", out="runs/custom-cnn")
result = pgc_mpi.fit(make_model, (x[:1500], y[:1500]), loss=smoothed_cross_entropy,
                     test_data=(x[1500:], y[1500:]), **options)
if result is not None:  # rank 0; the workers get None
    print(f"test accuracy {result.summary['final_test_accuracy']:.3f}, outputs in {result.out}")
