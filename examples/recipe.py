"""Your training recipe, not only your model: a ResNet-style SGD (momentum 0.9, nesterov, weight
decay on the weights only), warm-up then cosine decay, gradient clipping, accumulated micro-batches,
early stopping, the best checkpoint kept, and a CSV log; pgc-fr (s=1) on 4 workers.

    mpiexec -n 5 python examples/recipe.py                      # Ctrl-C: a checkpoint, exit status 3
    mpiexec -n 5 python examples/recipe.py --resume auto        # continues where it stopped
    pgc-export runs/recipe --checkpoint best --out model.pt     # the best model, for your own code

Any pgc-train flag on the command line overrides the options below (--steps 50, --scheme gc-cr, ...).
"""

from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn

import pgc_mpi
from pgc_mpi.runs.callbacks import BestCheckpoint, CSVLogger, EarlyStopping


def make_model() -> nn.Module:  # every rank builds it; rank 0's initial weights are trained
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16 * 4 * 4, 10))


def sgd(model: nn.Module) -> torch.optim.Optimizer:  # called once, on the master, with its copy of the model
    weights = [p for p in model.parameters() if p.ndim > 1]  # no weight decay on biases and batch-norm scales
    others = [p for p in model.parameters() if p.ndim <= 1]
    return torch.optim.SGD([{"params": weights, "weight_decay": 5e-4}, {"params": others, "weight_decay": 0.0}],
                           lr=0.2, momentum=0.9, nesterov=True)


def warmup_cosine(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=20)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=280, eta_min=1e-3)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[20])


x, y = load_digits(return_X_y=True)
x = (x / 16).astype("float32").reshape(-1, 1, 8, 8)
options = pgc_mpi.options_from_args(scheme="pgc-fr", stragglers=1, steps=300, batch_size=16, accumulate=2,
                                    clip_grad_norm=1.0, eval_every=20, checkpoint_every=50, delay="exp:0.01",
                                    out="runs/recipe")
callbacks = [EarlyStopping("test_accuracy", patience=5), BestCheckpoint("test_accuracy"),
             CSVLogger(Path(options["out"]) / "evals.csv")]
result = pgc_mpi.fit(make_model, (x[:1500], y[:1500]), test_data=(x[1500:], y[1500:]), optimizer=sgd,
                     scheduler=warmup_cosine, callbacks=callbacks, **options)
if result is not None:  # rank 0; the workers get None
    print(f"test accuracy {result.summary['final_test_accuracy']:.3f} after {result.summary['steps']} steps, "
          f"outputs in {result.out}")
    torch.save(result.state_dict(), result.out / "model.pt")  # loads into make_model() with load_state_dict
