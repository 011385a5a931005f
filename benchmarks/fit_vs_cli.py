"""Does a user script (pgc_mpi.fit) train as pgc-train does? The same trajectory, the same step time.

    python benchmarks/fit_vs_cli.py --pairs 5 --steps 200 --ranks 5

The same model, loss and data (examples/nets.py: a small CNN, focal loss, scikit-learn's digits)
trained twice per pair under mpiexec: by a script that passes the objects to pgc_mpi.fit, and by
`pgc-train --model/--loss/--dataset examples/nets.py:NAME`, in alternating order. The first pair
runs dgd in float64 with --record-params and checks that both paths give the same parameters at
every step (max difference printed); the timed pairs run pgc-cr in float32. Printed: each path's
median step time and process wall time, and the script/CLI ratios paired by pair, means with 95%
intervals over the pairs.
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

ROOT = Path(__file__).resolve().parents[1]
NETS = ROOT / "examples" / "nets.py"
SCRIPT = f"""import sys
sys.path.insert(0, {str(NETS.parent)!r})
import nets
import pgc_mpi

train, test = nets.digits()
pgc_mpi.fit(nets.make_model, train, loss=nets.focal_loss, test_data=test, **pgc_mpi.options_from_args())
"""


def run(command: list[str], out: Path, ranks: int) -> tuple[float, float]:
    """Run one job; (median step time, process wall time) in seconds."""
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    env = {**os.environ, "MPIEXEC_TIMEOUT": "900", "OMP_NUM_THREADS": "1"}
    began = time.perf_counter()
    proc = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, *command, "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=960)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
               if '"event": "summary"' in line][-1]
    return summary["median_step_time"], wall


def commands(script: Path, flags: list[str]) -> dict[str, list[str]]:
    plugins = ["--model", f"{NETS}:make_model", "--loss", f"{NETS}:focal_loss", "--dataset", f"{NETS}:digits"]
    return {"script": [str(script), *flags], "cli": ["-m", "pgc_mpi", "train", *flags, *plugins]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ranks", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        script = tmp / "train_nets.py"
        script.write_text(SCRIPT)
        flags = ["--scheme", "dgd", "--dtype", "float64", "--steps", "30", "--seed", "4", "--record-params"]
        for name, command in commands(script, flags).items():
            run(command, tmp / f"trajectory-{name}", args.ranks)
        a, b = (np.load(tmp / f"trajectory-{name}" / "params.npy") for name in ("script", "cli"))
        print(f"trajectory, dgd float64, {len(a) - 1} steps: max |script - cli| = {np.abs(a - b).max():.3g}")
        times: dict[str, list[tuple[float, float]]] = {"script": [], "cli": []}
        flags = ["--scheme", "pgc-cr", "-s", "1", "--steps", str(args.steps), "--eval-every", str(args.steps)]
        for pair in range(args.pairs):
            order = list(commands(script, [*flags, "--seed", str(pair)]).items())
            for name, command in order if pair % 2 == 0 else order[::-1]:
                times[name].append(run(command, tmp / f"{name}-{pair}", args.ranks))
        print(f"pgc-cr s=1, {args.ranks - 1} workers, {args.steps} steps, {args.pairs} pairs (mean [95% interval])")
        for index, what, unit, scale in ((0, "median step time", "ms", 1e3), (1, "process wall time", "s", 1.0)):
            values = {name: [t[index] for t in times[name]] for name in ("cli", "script")}
            print(paired_line(what, values, unit, scale))


if __name__ == "__main__":
    main()
