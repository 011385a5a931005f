"""A/B: the same pgc-train run under two source trees (e.g. the last release and this checkout),
or under this tree with two argument lists, paired run by run, alternating which goes first;
prints the median step time and the process wall time of each, with the ratio's 95% interval
over the pairs.

    git worktree add /tmp/before <commit>
    python benchmarks/ab_step_time.py --before /tmp/before --pairs 5 -- --problem quadratic --dim 100000 --steps 300

With --b-args FLAGS, run B adds FLAGS after the common flags (so a flag given in both takes B's
value); run A is this tree (or --before's) with the common flags alone:

    python benchmarks/ab_step_time.py --b-args "--lr-schedule cosine --warmup-steps 20 --clip-grad-norm 1.0" \
        --pairs 5 -- --scheme pgc-cr --problem quadratic --dim 1000000 --steps 300
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=out.parent, timeout=660)
    wall = time.monotonic() - began
    summary = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    return summary["median_step_time"], wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, help="the other source tree (holding pgc_mpi/): run A's")
    p.add_argument("--b-args", default="", metavar="FLAGS",
                   help="pgc-train flags (one string) that run B adds after the common ones")
    p.add_argument("--names", nargs=2, metavar=("A", "B"), help="the two variants' names in the output (default: "
                   "before after with --before alone, else without with)")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("args", nargs="*", help="pgc-train's flags, common to both (after --)")
    a = p.parse_args()
    if a.before is None and not a.b_args:
        p.error("give --before TREE, --b-args FLAGS, or both")
    names = a.names or (("before", "after") if not a.b_args else ("without", "with"))
    variants = {names[0]: (a.before.resolve() if a.before else HERE, a.args),
                names[1]: (HERE, a.args + shlex.split(a.b_args))}
    step: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as root:
        for k in range(a.pairs):
            order = list(variants) if k % 2 == 0 else list(reversed(variants))
            for name in order:
                tree, args = variants[name]
                s, w = run(tree, args, a.ranks, Path(root) / f"{name}-{k}")
                step[name].append(s)
                wall[name].append(w)
    print(paired_line("median step time", step, "ms", 1e3))
    print(paired_line("process wall time", wall, "s"))


if __name__ == "__main__":
    main()
