"""How the master's per-step work grows with N workers and model size d (in-process, no MPI).

    python benchmarks/master_scaling.py --workers 12 100 1000 --dims 100000 1000000

Per scheme it times the two parts of a decode on a random set of n-s arrivals: the weights
(scheme.decode_weights: for gc-cr a least-squares solve on an (n-s) x n system) and the
combination of the arrived d-float messages into g. Communication is measured separately, by
runtime_limits.py under MPI.
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np

from pgc_mpi.core.schemes import make_scheme


def best_of(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def combine(g: np.ndarray, scratch: np.ndarray, messages: np.ndarray, used: list[int], a: np.ndarray,
            streams: bool) -> None:
    """The master's two decode paths (master.Master._finish_decode) over the used messages."""
    g[:] = 0.0
    for k, i in enumerate(used):
        m = messages[k % len(messages)]
        if streams:
            g += m
        else:
            np.multiply(m, np.float32(a[i]), out=scratch)
            g += scratch
    if streams:
        g *= np.float32(a[used[0]])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[12, 100, 1000])
    p.add_argument("--dims", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--schemes", nargs="+", default=["pgc-cr", "pgc-fr", "gc-cr"])
    p.add_argument("-s", type=int, default=1)
    args = p.parse_args()
    print("| scheme | N | weights (ms) | combine d=" + " | combine d=".join(f"{d:,} (ms)" for d in args.dims) + " |")
    print("|---|---|---|" + "---|" * len(args.dims))
    rng = np.random.default_rng(0)
    for name in args.schemes:
        for n in args.workers:
            sch = make_scheme(name, n, args.s, seed=0)
            arrived = list(rng.permutation(n)[: n - args.s])
            weights = best_of(functools.partial(sch.decode_weights, arrived))
            a = sch.decode_weights(arrived)
            used = [i for i in arrived if a[i] != 0]
            cells = []
            for d in args.dims:
                # a ring of 8 distinct messages (larger than the caches) stands in for all arrivals
                messages = np.ones((min(8, len(used)), d), dtype=np.float32)
                g, scratch = np.zeros(d, dtype=np.float32), np.empty(d, dtype=np.float32)
                run = functools.partial(combine, g, scratch, messages, used, a, sch.streams)
                cells.append(f"{best_of(run) * 1e3:.1f}")
            print(f"| {name} | {n} | {weights * 1e3:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
