"""The memory estimate against measured peaks (docs/reliability.md, "Memory refused up front").

For each model size, one pgc-train run of --problem quadratic (no torch on the workers) under
mpiexec; while it runs, every rank's peak resident memory (VmHWM in /proc/PID/status) is read
until it exits. Each rank's growth is its peak minus its resident memory once the problem was
built (config.json's provenance.ranks, which is when pgc-train checks the estimate); the
estimate (pgc_mpi.config.memory.rank_need) is what the check compares with the memory available.

    python benchmarks/memory_estimate.py --dims 10000000 30000000 60000000
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

from pgc_mpi.config import TrainConfig
from pgc_mpi.config.memory import ProblemSize, rank_need, synthetic_size


def _peaks(out: Path) -> dict[int, float]:
    """pid -> VmHWM (MiB) of the live processes whose command line names `out`."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(out).encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    found[int(pid)] = int(line.split()[1]) / 1024
        except OSError:
            continue
    return found


def measure(args: list[str], ranks: int, root: Path) -> tuple[dict, dict[int, float]]:
    out = root / f"run-{time.monotonic_ns()}"
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(ranks), sys.executable, "-m", "pgc_mpi", "train",
           *args, "--out", str(out)]
    proc = subprocess.Popen(cmd, env={**os.environ, "MPIEXEC_TIMEOUT": "600"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    peaks: dict[int, float] = {}
    while proc.poll() is None:
        peaks.update(_peaks(out))
        time.sleep(0.02)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr[-1000:]}")
    return json.loads((out / "config.json").read_text()), peaks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[10_000_000, 30_000_000, 60_000_000])
    p.add_argument("--scheme", default="pgc-cr")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--extra", default="", help="more pgc-train flags, e.g. '--optimizer adam --servers 2'")
    a = p.parse_args()
    print("| dim | rank | role | resident at check (MiB) | peak (MiB) | growth (MiB) | estimate (MiB) | "
          "estimate / growth |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for dim in a.dims:
            args = ["--problem", "quadratic", "--dim", str(dim), "--scheme", a.scheme, "--steps", "20",
                    "--eval-every", "10", *a.extra.split()]
            config, peaks = measure(args, a.ranks, Path(root))
            cfg = TrainConfig(**config["config"])
            scheme = cfg.make_scheme(config["workers"])
            size: ProblemSize = synthetic_size(cfg)
            for rank, record in enumerate(config["provenance"]["ranks"]):
                need = rank_need(cfg, scheme, size, rank, torch_loaded=record["torch_loaded"])
                peak = peaks.get(record["pid"], float("nan"))
                growth = peak - record["rss_mib"]
                print(f"| {dim:,} | {rank} | {need.role} | {record['rss_mib']:.0f} | {peak:.0f} | {growth:.0f} | "
                      f"{need.total / 2**20:.0f} | {need.total / 2**20 / growth:.2f} |", flush=True)


if __name__ == "__main__":
    main()
