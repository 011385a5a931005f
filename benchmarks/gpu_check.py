"""Step time and bytes of resnet18 workers on the CPU and on a GPU, with and without page-locked
staging (benchmarks/gpu_check.sh runs it on a GPU machine).

    python benchmarks/gpu_check.py --batch-size 64 --reps 20
    python benchmarks/gpu_check.py --dry-run

For each configuration it times what a worker does per partition gradient: the model's
parameters in (host to device), forward and backward on a minibatch of digits (the built-in
data set, upsampled to 32x32 RGB so that resnet18 gets the input it is built for), the gradient
out (device to host), as TorchProblem.loss_and_grad does, float32; and prints the median and the
bytes a message of that model carries. Needs a CUDA GPU for the cuda rows (they are left out
without one).

--dry-run makes no CUDA call at all, GPU or not: it builds every row, the cuda ones included, and
runs each as far as a CPU can take it (the cuda rows on the CPU through the same staged host
mirrors, pageable, since page-locking memory is already a CUDA call), at minibatch 2 and 1 rep
unless told otherwise. Its figures are not measurements: it exists so that CI notices when an
import or a function this check uses has moved (benchmarks/gpu_check.sh --dry-run).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from pgc_mpi.learning.datasets import ArraySource, load_digits
from pgc_mpi.learning.torch_problem import TorchProblem

DRY_RUN_NOTE = "DRY RUN: no GPU figure was measured (every row ran on the CPU at toy sizes)"


@dataclasses.dataclass(frozen=True)
class Row:
    """One configuration of the table: its label, the device its worker computes on (None: the CPU),
    and whether the host mirrors of a GPU row are page-locked."""

    name: str
    device: torch.device | None
    pinned: bool | None


def digits_32x32_rgb(seed: int) -> ArraySource:
    """digits as 3x32x32 images (nearest upsampling, the grey level in every channel)."""
    digits = load_digits(seed)

    def grow(split: str) -> tuple[np.ndarray, np.ndarray]:
        x, y = digits.read_split(split)
        x = np.asarray(x, dtype=np.float32).reshape(len(x), 1, 8, 8).repeat(4, axis=2).repeat(4, axis=3)
        return np.repeat(x, 3, axis=1), np.asarray(y)

    info = dataclasses.replace(digits.info, name="digits-32x32-rgb", sample_shape=(3, 32, 32))
    return ArraySource(info, grow("train"), grow("test"))


def rows_to_time(cuda: bool) -> list[Row]:
    """The table's rows: the CPU, then (when `cuda`) GPU 0 with pinned and with pageable staging.
    torch.device("cuda", 0) is only a name: building it needs no GPU, so a dry run builds these too."""
    rows = [Row("cpu", None, None)]
    if cuda:
        rows += [Row("cuda, pinned staging", torch.device("cuda", 0), True),
                 Row("cuda, pageable staging", torch.device("cuda", 0), False)]
    return rows


def make_problem(row: Row, model: str, source: ArraySource, batch_size: int, dry_run: bool) -> TorchProblem:
    """The worker's problem of one row. In a dry run a GPU row stays on the CPU but keeps the GPU's
    code path (staged=True: the parameters and the gradient go through host mirrors, as on a GPU),
    with pageable mirrors: pin_memory=True is the first CUDA call, and a CPU-only torch refuses it."""
    if dry_run and row.device is not None:
        return TorchProblem(model, source, 2, batch_size, seed=0, dtype="float32", staged=True, pinned=False)
    return TorchProblem(model, source, 2, batch_size, seed=0, dtype="float32", device=row.device, pinned=row.pinned)


def time_gradients(problem: TorchProblem, reps: int) -> float:
    """The median time in seconds of `reps` gradients of partition 0, after one untimed warm-up."""
    w = problem.initial_params()
    problem.loss_and_grad(w, 0, 0)  # warm-up: cuDNN picks its kernels, the allocator fills
    times = []
    for draw in range(reps):
        began = time.perf_counter()
        problem.loss_and_grad(w, 0, draw)  # returns a host copy: the device work is finished
        times.append(time.perf_counter() - began)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, time every row and print the table (a dry run: see the module's docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=None, help="minibatch (default 64; 2 with --dry-run)")
    p.add_argument("--reps", type=int, default=None, help="timed gradients per row (default 20; 1 with --dry-run)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the CPU rows")
    p.add_argument("--dry-run", action="store_true",
                   help="no CUDA call: run every row on the CPU at toy sizes, to check that the code still runs")
    args = p.parse_args(argv)
    batch_size = args.batch_size if args.batch_size is not None else 2 if args.dry_run else 64
    reps = args.reps if args.reps is not None else 1 if args.dry_run else 20
    torch.set_num_threads(args.threads)
    source = digits_32x32_rgb(0)
    if args.dry_run:
        print(f"{DRY_RUN_NOTE}: the cuda rows take the GPU's staged path on the CPU, pageable")
        rows = rows_to_time(cuda=True)  # not torch.cuda.is_available(): a dry run is the same on any machine
    else:
        rows = rows_to_time(torch.cuda.is_available())
        if len(rows) == 1:
            print("(no CUDA GPU: only the CPU row)")
    print(f"{args.model}, float32, minibatch {batch_size}, median of {reps} gradients\n")
    print("| worker | parameters | MB per message | ms per gradient (in, forward, backward, out) |")
    print("|---|---|---|---|")
    for row in rows:
        problem = make_problem(row, args.model, source, batch_size, args.dry_run)
        seconds = time_gradients(problem, reps)
        name = f"{row.name} (dry run: on the cpu)" if args.dry_run and row.device is not None else row.name
        print(f"| {name} | {problem.dim:,} | {problem.dim * 4 / 1e6:.1f} | {1e3 * seconds:.1f} |", flush=True)
    if args.dry_run:
        print(f"\n{DRY_RUN_NOTE}")


if __name__ == "__main__":
    main()
