"""The diagnosis of the stale schemes' failure under momentum: the top Hessian eigenvalue along a
dgd-like run of BENCHMARKS.md §20's recipe, against the stability limits of a linear model.

The model: f = h·x²/2, the master's update torch's SGD with Nesterov momentum μ
(buf = μ·buf + g; x -= lr·(g + μ·buf)) applied to a decoded gradient g_t = h·Σ_a w_a·x_{t−a}
(w = (1) for dgd, (1/c, …, 1/c) for the paper's pgc estimator, e(a)/c for --staleness-correction
weights:R). `stability_limit` finds the largest stable lr·h by bisection on the spectral radius of
the update's companion matrix. The run: the plain torch loop of recipe_time_to_accuracy.py (batch
workers × batch-size, warm-up + cosine, clipping), with a power iteration of Hessian-vector
products on a fixed 2,048-sample training batch at the chosen steps; lr·λ_max above a scheme's
limit means that scheme's update is unstable along the top direction at that moment.

    python benchmarks/hessian_top.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_time_to_accuracy import plain_loop  # noqa: E402

from pgc_mpi.core.age_weights import age_weights  # noqa: E402


def spectral_radius(a: float, weights: np.ndarray, mu: float) -> float:
    """Of the linear update x -> (x_t, ..., x_{t-c+1}, buf) at lr·h = a."""
    c = len(weights)
    n = c + 1  # the c latest iterates, then the momentum buffer
    g = np.zeros(n)
    g[:c] = weights  # g_t / h over the state
    buf = mu * np.eye(n)[c] + g  # buf_t = mu buf_{t-1} + g_t
    x_next = np.eye(n)[0] - a * (g + mu * buf)
    m = np.zeros((n, n))
    m[0] = x_next
    for k in range(1, c):
        m[k, k - 1] = 1.0  # shift the iterates
    m[c] = buf
    return float(np.abs(np.linalg.eigvals(m)).max())


def stability_limit(weights: np.ndarray, mu: float = 0.9) -> float:
    """The largest a = lr·h with spectral radius below 1 (bisection from a stable 0+)."""
    low, high = 1e-6, 1.0
    while spectral_radius(high, weights, mu) < 1.0:
        high *= 2.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if spectral_radius(mid, weights, mu) < 1.0 else (low, mid)
    return low


def top_eigenvalue(model, x, y, iterations: int = 20, seed: int = 0) -> float:
    """λ_max of the loss's Hessian on (x, y) by power iteration on Hessian-vector products."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()  # the same function at every product (no dropout; the cnn has no batch norm)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    gen = torch.Generator().manual_seed(seed)
    v = [torch.randn(p.shape, generator=gen) for p in params]
    eig = 0.0
    for _ in range(iterations):
        norm = torch.sqrt(sum((u * u).sum() for u in v))
        v = [u / norm for u in v]
        hv = torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True)
        eig = float(sum((a * b).sum() for a, b in zip(v, hv)))
        v = [h.detach() for h in hv]
    return eig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="data/fashion-mnist.h5")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--at", type=int, nargs="+", default=[0, 15, 30, 60, 100, 150, 299])
    a = p.parse_args()
    run = argparse.Namespace(dataset=a.dataset, plain_threads=2, optimizer="benchmarks/recipe_factories.py:nesterov_wd",
                             lr=0.1, warmup_steps=30, clip_grad_norm=2.0, workers=12, batch_size=16, eval_every=20)
    limits = {"dgd": stability_limit(np.ones(1))}
    for c in (2, 3):
        limits[f"paper c={c}"] = stability_limit(np.ones(c) / c)
        for ratio in (0.5, 0.3, 0.0):
            limits[f"weights:{ratio:g} c={c}"] = stability_limit(age_weights(c, ratio) / c)
    print("largest stable lr·h (Nesterov 0.9): " + ", ".join(f"{k} {v:.3f}" for k, v in limits.items()))
    rows: dict[int, list[tuple[float, float]]] = {t: [] for t in a.at}
    for seed in a.seeds:
        fixed = np.random.default_rng([seed, 0x4E55]).permutation(60000)[:2048]

        def look(t, model, x, y, lr, fixed=fixed, seed=seed):
            if t in rows:
                import torch

                rows[t].append((lr, top_eigenvalue(model, x[torch.from_numpy(fixed)], y[torch.from_numpy(fixed)],
                                                   seed=seed)))

        curve, _ = plain_loop(run, seed, a.steps, look)
        print(f"seed {seed}: final test accuracy {curve[-1][1]:.4f}", flush=True)
    print("\n| step | lr | λ_max | lr·λ_max | over the limit of |")
    print("|---|---|---|---|---|")
    for t, values in rows.items():
        lrs, eigs = np.array([v[0] for v in values]), np.array([v[1] for v in values])
        products = lrs * eigs
        over = [k for k, limit in limits.items() if products.mean() > limit]
        print(f"| {t} | {lrs.mean():.4f} | {eigs.mean():.1f} [{eigs.min():.1f}, {eigs.max():.1f}] "
              f"| {products.mean():.2f} [{products.min():.2f}, {products.max():.2f}] | {', '.join(over) or '-'} |")


if __name__ == "__main__":
    main()
