"""Step time and bytes of resnet18 workers on the CPU and on a GPU, with and without page-locked
staging (benchmarks/gpu_check.sh runs it on a GPU machine).

    python benchmarks/gpu_check.py --batch-size 64 --reps 20

For each configuration it times what a worker does per partition gradient: the model's
parameters in (host to device), forward and backward on a minibatch of digits (the built-in
data set, upsampled to 32x32 RGB so that resnet18 gets the input it is built for), the gradient
out (device to host), as TorchProblem.loss_and_grad does, float32; and prints the median and the
bytes a message of that model carries. Needs a CUDA GPU for the cuda rows (they are left out
without one).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from pgc_mpi.learning.datasets import ArraySource, load_digits
from pgc_mpi.learning.models import TorchProblem


def digits_32x32_rgb(seed: int) -> ArraySource:
    """digits as 3x32x32 images (nearest upsampling, the grey level in every channel)."""
    digits = load_digits(seed)

    def grow(split: str) -> tuple[np.ndarray, np.ndarray]:
        x, y = digits.read_split(split)
        x = np.asarray(x, dtype=np.float32).reshape(len(x), 1, 8, 8).repeat(4, axis=2).repeat(4, axis=3)
        return np.repeat(x, 3, axis=1), np.asarray(y)

    info = dataclasses.replace(digits.info, name="digits-32x32-rgb", sample_shape=(3, 32, 32))
    return ArraySource(info, grow("train"), grow("test"))


def time_gradients(problem: TorchProblem, reps: int) -> float:
    w = problem.initial_params()
    problem.loss_and_grad(w, 0, 0)  # warm-up: cuDNN picks its kernels, the allocator fills
    times = []
    for draw in range(reps):
        began = time.perf_counter()
        problem.loss_and_grad(w, 0, draw)  # returns a host copy: the device work is finished
        times.append(time.perf_counter() - began)
    return float(np.median(times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the CPU rows")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    source = digits_32x32_rgb(0)
    rows = [("cpu", None, None)]
    if torch.cuda.is_available():
        rows += [("cuda, pinned staging", torch.device("cuda", 0), True),
                 ("cuda, pageable staging", torch.device("cuda", 0), False)]
    else:
        print("(no CUDA GPU: only the CPU row)")
    print(f"{args.model}, float32, minibatch {args.batch_size}, median of {args.reps} gradients\n")
    print("| worker | parameters | MB per message | ms per gradient (in, forward, backward, out) |")
    print("|---|---|---|---|")
    for name, device, pinned in rows:
        problem = TorchProblem(args.model, source, 2, args.batch_size, seed=0, dtype="float32", device=device,
                               pinned=pinned)
        seconds = time_gradients(problem, args.reps)
        print(f"| {name} | {problem.dim:,} | {problem.dim * 4 / 1e6:.1f} | {1e3 * seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
