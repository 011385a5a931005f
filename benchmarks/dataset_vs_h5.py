"""What does a Python torch Dataset cost against pgc-mpi's HDF5 rows? Step time and start-up, paired.

    python -m data_prep fashion-mnist --out data/fashion-mnist.h5
    python benchmarks/dataset_vs_h5.py --data data/fashion-mnist.h5 --model cnn --pairs 5

The same samples trained twice per pair under mpiexec with pgc-train: from the HDF5 file
(`--dataset FILE.h5`: each worker reads its partitions' rows once at start and keeps them in
memory as tensors) and from a map-style torch Dataset over the same arrays (`--dataset
PLUGIN:data`: read lazily, `__getitem__` and default_collate for every minibatch), in
alternating order. The first pair also checks that both give the same parameters at every step
(dgd, float64). Printed: median step time and start-up time (process wall time minus the run's
own wall time: MPI start, imports, data reads, and the end), means with 95% intervals over the
pairs and the Dataset/HDF5 ratios paired by pair.
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

from pgc_mpi.runs.stats import paired_line

# The plug-in: the HDF5 file's arrays behind a plain map-style Dataset (what a user writes).
PLUGIN = """import os
import h5py
import torch
from torch.utils.data import Dataset


class Rows(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), int(self.y[i])


def data():
    with h5py.File(os.environ["BENCH_H5"], "r") as f:
        return Rows(f["train/x"][...], f["train/y"][...]), Rows(f["test/x"][...], f["test/y"][...])
"""


def run(flags: list[str], out: Path, ranks: int, h5: Path) -> tuple[float, float]:
    """One pgc-train job: (median step time, start-up time) in seconds."""
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    env = {**os.environ, "MPIEXEC_TIMEOUT": "1800", "OMP_NUM_THREADS": "1", "BENCH_H5": str(h5)}
    began = time.perf_counter()
    proc = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "pgc_mpi", "train", *flags, "--out",
                           str(out)], env=env, capture_output=True, text=True, timeout=1900)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"pgc-train {' '.join(flags)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
               if '"event": "summary"' in line][-1]
    return summary["median_step_time"], wall - summary["wall_time"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="an HDF5 file of python -m data_prep")
    p.add_argument("--model", default="cnn")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ranks", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    h5 = args.data.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "rows.py").write_text(PLUGIN)
        sources = {"hdf5": ["--dataset", str(h5)], "dataset": ["--dataset", f"{tmp / 'rows.py'}:data"]}
        check = ["--model", args.model, "--scheme", "dgd", "--dtype", "float64", "--steps", "10", "--record-params",
                 "--lr", str(args.lr), "--eval-every", "100", "--no-eval-train"]
        for name, source in sources.items():
            run([*check, *source], tmp / f"trajectory-{name}", args.ranks, h5)
        a, b = (np.load(tmp / f"trajectory-{name}" / "params.npy") for name in sources)
        print(f"trajectory, dgd float64, {len(a) - 1} steps: max |dataset - hdf5| = {np.abs(a - b).max():.3g}")
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in sources}
        flags = ["--model", args.model, "--scheme", "pgc-cr", "-s", "1", "--steps", str(args.steps), "--lr",
                 str(args.lr), "--eval-every", str(args.steps), "--no-eval-train"]
        for pair in range(args.pairs):
            order = list(sources.items()) if pair % 2 == 0 else list(sources.items())[::-1]
            for name, source in order:
                times[name].append(run([*flags, *source, "--seed", str(pair)], tmp / f"{name}-{pair}", args.ranks, h5))
        print(f"{args.model} on {h5.name}, pgc-cr s=1, {args.ranks - 1} workers, {args.steps} steps, {args.pairs} "
              f"pairs (mean [95% interval])")
        for index, what, unit, scale in ((0, "median step time", "ms", 1e3), (1, "start-up time", "s", 1.0)):
            print(paired_line(what, {name: [t[index] for t in times[name]] for name in times}, unit, scale))


if __name__ == "__main__":
    main()
