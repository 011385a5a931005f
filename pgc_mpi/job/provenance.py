"""Where a run came from: what config.json records besides the configuration.

The command line, the pgc-mpi version and git commit (when run from a checkout), the UTC start
time, the host of every rank, the Slurm job, step and array ids, the MPI library and the
versions of the Python packages, and every rank's process (`ranks`, by rank: rank_record, taken
once its problem is built). After a resume the earlier starts are kept (`earlier_starts`), so
the folder says how its run was put together.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_STEP_ID",
                   "SLURM_JOB_NODELIST", "SLURM_RESTART_COUNT", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION")


def versions() -> dict[str, str]:
    """The Python, package and MPI library versions of this process (imports torch)."""
    import h5py
    import mpi4py
    import numpy as np
    import torch
    from mpi4py import MPI

    return {"python": platform.python_version(), "pgc_mpi": package_version(), "mpi4py": mpi4py.__version__,
            "numpy": np.__version__, "torch": torch.__version__, "h5py": h5py.__version__,
            "mpi_library": MPI.Get_library_version().splitlines()[0].strip()}


def package_version() -> str:
    """pgc-mpi's installed version ("unknown" when it runs from a tree that is not installed)."""
    try:
        return metadata.version("pgc-mpi")
    except metadata.PackageNotFoundError:
        return "unknown"


PACKAGE_DIR = Path(__file__).resolve().parent


def git_commit(where: Path = PACKAGE_DIR) -> str | None:
    """The commit of the checkout the package runs from, with "-dirty" when it has uncommitted
    changes (None outside a git checkout, or without git)."""
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def resident_memory() -> dict[str, float | None]:
    """This process's resident memory now (VmRSS) and at its peak so far (VmHWM), in MiB, from
    /proc/self/status (None where there is no such file: not Linux)."""
    found: dict[str, float | None] = {"rss_mib": None, "peak_rss_mib": None}
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        key, _, value = line.partition(":")
        name = {"VmRSS": "rss_mib", "VmHWM": "peak_rss_mib"}.get(key)
        if name and value.split():
            found[name] = round(int(value.split()[0]) / 1024, 1)  # kB
    return found


def rank_record() -> dict[str, Any]:
    """This rank's process as config.json's provenance lists it: its pid, whether torch has been
    imported in it (a worker of a synthetic --problem never imports it), and its resident memory."""
    return {"pid": os.getpid(), "torch_loaded": "torch" in sys.modules, **resident_memory()}


def describe_rank(record: dict[str, Any]) -> str:
    """A rank_record in words, for the log."""
    def mib(value: float | None) -> str:
        return "?" if value is None else f"{value:.0f} MiB"

    return (f"process {record['pid']}, resident memory {mib(record['rss_mib'])} (peak {mib(record['peak_rss_mib'])}), "
            f"torch {'loaded' if record['torch_loaded'] else 'not loaded'}")


def start_record(argv: list[str], hosts: list[str], program: str = "pgc-train") -> dict[str, Any]:
    """This start of the run: the program (pgc-train or pgc_mpi.fit: a fit run's model and data may
    be Python objects that config.json names only by label, which pgc-advise must not take for
    plug-ins), command line, UTC time, hosts by rank, Slurm ids, code versions."""
    return {"program": program, "command_line": [Path(sys.argv[0]).name, *argv],
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hosts": hosts, "slurm": {k: os.environ[k] for k in SLURM_VARIABLES if k in os.environ},
            "git_commit": git_commit(), "versions": versions()}


def with_earlier_starts(start: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """The provenance of a run that resumed: this start, and the starts recorded before it."""
    if not previous:
        return {**start, "earlier_starts": []}
    earlier = previous.get("earlier_starts", [])
    before = {k: v for k, v in previous.items() if k != "earlier_starts"}
    return {**start, "earlier_starts": [*earlier, before]}
