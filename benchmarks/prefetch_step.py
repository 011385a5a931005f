"""Does loading ahead take a slow Dataset off the worker's critical path? Median step time with
and without loader processes, paired.

    python -m data_prep fashion-mnist --out data/fashion-mnist.h5
    python benchmarks/prefetch_step.py --data data/fashion-mnist.h5 --pairs 2 --out bench/prefetch

pgc-train trains logreg on the file's samples under mpiexec, with emulated compute
(--compute-time, a sleep: ranks sharing this machine's cores behave like nodes) and no injected
delays. The samples come from a map-style torch Dataset over the file's arrays (`--dataset
PLUGIN:data`) whose `__getitem__` sleeps --sample-ms per sample: a read that waits on storage or a
transform that releases the GIL, as image decoding does; a Python-heavy transform would take the
cores the emulated ranks share here. Each (workers, scheme, ms per sample) runs with
`--loader-workers 0` (each worker reads its own minibatches) and with the default `auto` (two
loader processes per worker), in alternating order per pair; the HDF5 file itself (rows held in
memory: loading is free) runs once per pair as the reference for what a step costs besides its
compute and loading: the communication and the master (its median step minus --compute-time).

Printed per row: the load of one minibatch (ms per sample x --batch-size), the median step time
with `--loader-workers 0` and with the row's arm (`auto`; and at --forced ms per sample also `2`,
loaders whatever the reads cost), means over the pairs, their ratio paired by pair with its 95%
interval, the workers' median data wait with the arm, and the goal's figure: the arm's median step
over max(load, compute) + the reference's communication (goal: at most 1.1). With --out, every
run's folder stays there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pgc_mpi.core.message import MessageRecord
from pgc_mpi.runs.results import read_steps
from pgc_mpi.runs.stats import interval

# The plug-in: the HDF5 file's arrays behind a map-style Dataset whose every read takes BENCH_SAMPLE_S.
PLUGIN = """import os
import time

import h5py
import torch
from torch.utils.data import Dataset

SAMPLE_S = float(os.environ["BENCH_SAMPLE_S"])


class SlowRows(Dataset):
    def __init__(self, x, y, sample_s):
        self.x, self.y, self.sample_s = x, y, sample_s

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if self.sample_s:
            time.sleep(self.sample_s)
        return torch.from_numpy(self.x[i]), int(self.y[i])


def data():
    rows = int(os.environ["BENCH_ROWS"])
    with h5py.File(os.environ["BENCH_H5"], "r") as f:
        return (SlowRows(f["train/x"][:rows], f["train/y"][:rows], SAMPLE_S),
                SlowRows(f["test/x"][:rows // 6], f["test/y"][:rows // 6], 0))
"""


def run(flags: list[str], out: Path, ranks: int, env: dict[str, str]) -> dict[str, float]:
    """One pgc-train job: its median step time, and its messages' median data wait and compute time."""
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    proc = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "pgc_mpi", "train", *flags, "--out",
                           str(out), "--overwrite"], env=env, capture_output=True, text=True, timeout=1900)
    if proc.returncode != 0:
        raise SystemExit(f"pgc-train {' '.join(flags)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
               if '"event": "summary"' in line][-1]
    messages = [MessageRecord._make(m) for r in read_steps(out) for m in r.get("messages", ())
                if m[5] != "rejected"]
    waits = [m.data_wait for m in messages if m.data_wait is not None]
    return {"step": summary["median_step_time"], "data_wait": float(np.median(waits)) if waits else float("nan"),
            "compute": float(np.median([m.compute_time for m in messages]))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="an HDF5 file of python -m data_prep")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--compute-time", type=float, default=0.05)
    p.add_argument("--workers", type=int, nargs="+", default=[4, 12])
    p.add_argument("--schemes", nargs="+", default=["dgd", "pgc-cr"])
    p.add_argument("--sample-ms", type=float, nargs="+", default=[0.0, 0.2, 0.5, 2.0])
    p.add_argument("--rows", type=int, default=12000, help="the Dataset's training rows (the file's first)")
    p.add_argument("--forced", type=float, nargs="*", default=[0.0],
                   help="ms per sample at which --loader-workers 2 runs too (auto may start none)")
    p.add_argument("--out", type=Path, default=None, help="keep the runs' folders here")
    args = p.parse_args()
    h5 = args.data.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        plugin = Path(tmp) / "slow_rows.py"
        plugin.write_text(PLUGIN)
        base = {**os.environ, "MPIEXEC_TIMEOUT": "1800", "OMP_NUM_THREADS": "1", "BENCH_H5": str(h5),
                "BENCH_ROWS": str(args.rows)}
        print(f"logreg on {h5.name}, batch {args.batch_size}, --compute-time {args.compute_time}, {args.steps} steps, "
              f"{args.pairs} pairs (mean [95% interval] over the pairs)")
        print(f"{'workers':>7} {'scheme':>7} {'ms/sample':>9} {'load ms':>8} {'step, 0':>11} {'step, arm':>16} "
              f"{'arm/0':>22} {'data wait':>10} {'goal fig.':>9}", flush=True)
        for workers in args.workers:
            for scheme in args.schemes:
                flags = ["--model", "logreg", "--scheme", scheme, "-s", "1", "--steps", str(args.steps),
                         "--batch-size", str(args.batch_size), "--compute-time", str(args.compute_time),
                         "--eval-every", str(args.steps), "--no-eval-train", "--log-interval", "600"]
                reference = [run([*flags, "--dataset", str(h5), "--seed", str(pair)],
                                 root / f"{workers}-{scheme}-hdf5-{pair}", workers + 1, {**base, "BENCH_SAMPLE_S": "0"})
                             for pair in range(args.pairs)]
                comm = float(np.mean([r["step"] for r in reference])) - args.compute_time
                step, wait = (np.mean([r[k] for r in reference]) * 1e3 for k in ("step", "data_wait"))
                print(f"{workers:>7} {scheme:>7} {'hdf5':>9} {0:>8.1f} {step:>9.1f}ms {'':>16} {'':>22} {wait:>8.2f}ms",
                      flush=True)
                for ms in args.sample_ms:
                    env = {**base, "BENCH_SAMPLE_S": str(ms / 1e3)}
                    arms = ("0", "auto", *(("2",) if ms in args.forced else ()))
                    got: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
                    for pair in range(args.pairs):
                        for loaders in (arms if pair % 2 == 0 else arms[::-1]):
                            got[loaders].append(run([*flags, "--dataset", f"{plugin}:data", "--seed", str(pair),
                                                     "--loader-workers", loaders],
                                                    root / f"{workers}-{scheme}-{ms}ms-{loaders}-{pair}", workers + 1,
                                                    env))
                    load = ms * args.batch_size / 1e3
                    none = [r["step"] for r in got["0"]]
                    for arm in arms[1:]:
                        ahead = [r["step"] for r in got[arm]]
                        ratio = interval([b / a for a, b in zip(none, ahead)])
                        goal = np.mean(ahead) / (max(load, args.compute_time) + comm)
                        wait = np.mean([r["data_wait"] for r in got[arm]]) * 1e3
                        print(f"{workers:>7} {scheme:>7} {ms:>9g} {load * 1e3:>8.1f} {np.mean(none) * 1e3:>9.1f}ms "
                              f"{np.mean(ahead) * 1e3:>9.1f}ms {arm:>4} {ratio.mean:>6.3f} [{ratio.low:.3f}, "
                              f"{ratio.high:.3f}]   {wait:>8.2f}ms {goal:>9.3f}", flush=True)


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s)")
