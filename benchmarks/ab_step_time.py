"""A/B: the same pgc-train run under two source trees (e.g. the last release and this checkout),
paired run by run, alternating which goes first; prints the median step time and the process
wall time of each, with the ratio's 95% interval over the pairs.

    git worktree add /tmp/before <commit>
    python benchmarks/ab_step_time.py --before /tmp/before --pairs 5 -- --problem quadratic --dim 100000 --steps 300
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

from pgc_mpi.runs.stats import paired_line

HERE = Path(__file__).resolve().parents[1]


def run(tree: Path, args: list[str], ranks: int, out: Path) -> tuple[float, float]:
    """(median step time, process wall time) of one run with `tree`'s pgc_mpi."""
    env = {**os.environ, "PYTHONPATH": str(tree), "MPIEXEC_TIMEOUT": "600", "OMP_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(ranks), sys.executable, "-m", "pgc_mpi", "train",
           *args, "--out", str(out)]
    began = time.monotonic()
    # run outside both trees: the working folder comes first on sys.path and would shadow PYTHONPATH
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=out.parent)
    wall = time.monotonic() - began
    summary = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    return summary["median_step_time"], wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="the other source tree (holding pgc_mpi/)")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("args", nargs="*", help="pgc-train's flags (after --)")
    a = p.parse_args()
    trees = {"before": a.before.resolve(), "after": HERE}
    step: dict[str, list[float]] = {name: [] for name in trees}
    wall: dict[str, list[float]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as root:
        for k in range(a.pairs):
            order = list(trees) if k % 2 == 0 else list(reversed(trees))
            for name in order:
                s, w = run(trees[name], a.args, a.ranks, Path(root) / f"{name}-{k}")
                step[name].append(s)
                wall[name].append(w)
    print(paired_line("median step time", step, "ms", 1e3))
    print(paired_line("process wall time", wall, "s"))


if __name__ == "__main__":
    main()
