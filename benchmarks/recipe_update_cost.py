"""The master's update alone, with and without the recipe: FlatOptimizer.step() on a flat vector
(float32, 11.2M numbers by default: resnet18's size), in one process, no MPI.

Every step computes the gradient's global norm (every step record carries grad_norm, clipped or
not); clipping adds one scaling of the gradient when the norm is over the limit; a schedule adds
a LambdaLR step. The rows: the whole step() for each recipe, then its parts alone: the norm
(FlatOptimizer.grad_norm), torch's optimizer step, and for reference the same norm summed in
float32 by NumPy. The gradient buffer is refilled before every repetition (not timed), so
clipping scales it every time. Median over --reps repetitions after --warmup ones.

    python benchmarks/recipe_update_cost.py --dim 11200000 --reps 50
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from pgc_mpi.learning.optim import FlatOptimizer, Recipe


def median_ms(fn: Callable[[], object], refill: Callable[[], None], reps: int, warmup: int) -> tuple[float, float]:
    """Median and 90th percentile (ms) of fn() over `reps` timed calls, refill() before each."""
    times = []
    for k in range(warmup + reps):
        refill()
        began = time.perf_counter()
        fn()
        if k >= warmup:
            times.append(time.perf_counter() - began)
    return 1e3 * float(np.median(times)), 1e3 * float(np.percentile(times, 90))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=11_200_000)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--optimizer", default="sgd", help="a built-in: sgd, momentum, nesterov, adam, adamw")
    p.add_argument("--clip", type=float, default=1.0, help="the --clip-grad-norm of the clipped rows")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)  # as pgc-train's ranks (--threads 1)
    rng = np.random.default_rng(0)
    grad = (rng.standard_normal(a.dim) / np.sqrt(a.dim) * 10 * a.clip).astype(a.dtype)  # norm about 10x the clip
    steps = a.warmup + a.reps + 1
    recipes = {
        "constant lr, no clipping": Recipe(optimizer=a.optimizer, lr=0.1, steps=steps),
        f"constant lr, --clip-grad-norm {a.clip:g}": Recipe(optimizer=a.optimizer, lr=0.1, steps=steps,
                                                             clip_grad_norm=a.clip),
        f"cosine, --warmup-steps 20, --clip-grad-norm {a.clip:g}": Recipe(
            optimizer=a.optimizer, lr=0.1, steps=steps, lr_schedule="cosine", warmup_steps=20, clip_grad_norm=a.clip),
    }
    print(f"d = {a.dim:,} ({a.dtype}), --optimizer {a.optimizer}, 1 torch thread; median [90th percentile] over "
          f"{a.reps} repetitions\n")
    print("| what | ms |")
    print("|---|---|")
    for name, recipe in recipes.items():
        w = np.zeros(a.dim, dtype=a.dtype)
        opt = FlatOptimizer(w, recipe)
        med, p90 = median_ms(opt.step, lambda opt=opt: np.copyto(opt.grad, grad), a.reps, a.warmup)
        print(f"| FlatOptimizer.step(), {name} | {med:.2f} [{p90:.2f}] |")
    w = np.zeros(a.dim, dtype=a.dtype)
    opt = FlatOptimizer(w, recipes["constant lr, no clipping"])
    refill = lambda: np.copyto(opt.grad, grad)  # noqa: E731
    parts: dict[str, Callable[[], object]] = {
        "its part: grad_norm() (float64, as the step computes it)": opt.grad_norm,
        "its part: torch's optimizer step alone": opt.opt.step,
        "its part: scaling the gradient (clipping, gradient *= c)": lambda: opt.grad.__imul__(0.5),
        "reference: np.dot(g, g) in the gradient's own dtype": lambda: np.dot(opt.grad, opt.grad),
    }
    for name, fn in parts.items():
        med, p90 = median_ms(fn, refill, a.reps, a.warmup)
        print(f"| {name} | {med:.2f} [{p90:.2f}] |")


if __name__ == "__main__":
    main()
