"""How rounding messages to the wire format shows in the decoded gradient, scheme by scheme.

    python benchmarks/wire_decode_error.py --workers 12 --stragglers 1 2 3 --trials 200

Exact decoding (gc-cr, gc-fr, dgd) recovers the sum of the partition gradients from any n - s
coded messages: g = sum_i a_i m_i with m_i = sum_j B_ij g_j. When every m_i is rounded to the wire
format (relative error up to eps: 2^-8 bfloat16, 2^-11 float16, 2^-24 float32), the decoded
gradient's error is sum_i a_i * rounding(m_i): small when the decode weights a_i are small, large
when they are large, and gc-cr's random encoding has large weights for some sets of arrivals.
This script draws partition gradients (standard normal, float64), encodes them with the
scheme's B, rounds every message, decodes the first n - s of a random arrival order, and prints
the relative error ||g_hat - g|| / ||g|| (median and the worst over --trials draws) beside the
largest |a_i| of those decodes. Pure NumPy; no MPI.
"""

from __future__ import annotations

import argparse

import numpy as np

from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.core.wire import WIRE_DTYPES, wire_format


def decode_errors(name: str, n: int, s: int, seed: int, dim: int, trials: int, wire: str) -> tuple[list, list]:
    """(relative errors, largest |a_i|) of `trials` decodes from random n - s arrivals."""
    scheme = make_scheme(name, n, s, seed=seed)
    b = scheme.encoding_matrix()
    rng = np.random.default_rng(seed)
    fmt = wire_format(wire, np.float64)
    errors, weights = [], []
    for _ in range(trials):
        g = rng.standard_normal((n, dim))  # one gradient per partition
        messages = fmt.round_trip(b @ g)
        arrived = [int(i) for i in rng.permutation(n)[: n - s]]
        a = scheme.decode_weights(arrived)
        decoded = a @ messages
        exact = scheme.partition_weights(a) @ g  # what the decode gives unrounded (the mean gradient when exact)
        errors.append(float(np.linalg.norm(decoded - exact) / np.linalg.norm(exact)))
        weights.append(float(np.abs(a).max()))
    return errors, weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--stragglers", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--schemes", nargs="+", default=["gc-fr", "gc-cr", "pgc-cr"])
    p.add_argument("--wire", nargs="+", default=list(WIRE_DTYPES))
    p.add_argument("--dim", type=int, default=10_000)
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--seeds", type=int, default=5, help="encodings drawn per scheme (gc-cr's B is random)")
    args = p.parse_args()
    print(f"n = {args.workers}, {args.trials} decodes per seed x {args.seeds} seeds, d = {args.dim}, "
          "partition gradients standard normal; relative error of the decoded gradient\n")
    columns = " | ".join(f"{w} median / max" for w in args.wire)
    print(f"| scheme | s | largest abs(a_i), median / max | {columns} |")
    print("|---|---|---|" + "---|" * len(args.wire))
    for name in args.schemes:
        for s in args.stragglers:
            cells, weights = [], []
            for wire in args.wire:
                errors = []
                for seed in range(args.seeds):
                    e, w = decode_errors(name, args.workers, s, seed, args.dim, args.trials, wire)
                    errors += e
                    weights += w
                cells.append(f"{np.median(errors):.1e} / {max(errors):.1e}")
            print(f"| {name} | {s} | {np.median(weights):.2g} / {max(weights):.3g} | " + " | ".join(cells) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
