"""MPICH's start-up shared-memory segments: unlink ours once the job is up, remove stale ones.

MPICH (4.x/5.x, ch4) creates one POSIX shared-memory file per node at MPI_Init,
/dev/shm/mpich_shm_<world id>_<node>, where the world id is the FNV-1a hash of the process
manager's job name: "JOBID.STEPID" under Slurm's PMI2, "kvs_<pid of mpiexec>_0" under hydra.
The node's first rank creates it and only MPI_Finalize unlinks it, so every job that is killed
or aborted leaves its file behind. A later job whose name hashes to the same id (Slurm job ids
restart when a cluster's state is reset; process ids are reused) then opens the stale file
instead of a fresh one and hangs in MPI_Init, or fails there with garbage from the old job's
queues. Measured on this project's single-node Slurm: a job killed with SIGKILL left
mpich_shm_eb421bf2_0 (the hash of "1.0"), and the next cluster's job 1 hung in MPI_Init until
the file was removed (tests/test_slurm.py makes this happen on purpose).

Two defences, both Linux-only (/proc) and no-ops elsewhere:
- `unlink_own_segments` (pgc-train's main, once the world communicator is duplicated): once every
  rank has finished MPI_Init, the segment's name is no longer needed (every local rank has it
  mapped), so each rank unlinks the names it maps. The memory lives on until the job ends, and
  nothing is left behind however the job ends.
- `remove_stale` (pgc-train's entry, on every rank before MPI_Init, so on every node): delete
  segments that no process maps any more, left by other MPI programs that were killed.

This module does not import MPI: callers decide when the job is up.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIXES = ("mpich_shm_", "mpich_vci_")


def _is_mpich_segment(path: str, directory: Path) -> bool:
    p = Path(path)
    return p.parent == directory and p.name.startswith(PREFIXES)


def mapped_segments(maps_files: list[Path], directory: Path = SHM_DIR) -> set[Path]:
    """MPICH segment files under `directory` that the given /proc/<pid>/maps files map."""
    found: set[Path] = set()
    for maps in maps_files:
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or it is not ours to read
            continue
        for line in text.splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and not parts[5].endswith("(deleted)") and _is_mpich_segment(parts[5], directory):
                found.add(Path(parts[5]))
    return found


def segments_in_use(directory: Path = SHM_DIR) -> set[Path]:
    """MPICH segment files under `directory` that some process we can see maps now."""
    return mapped_segments(list(Path("/proc").glob("[0-9]*/maps")), directory)


def unlink_own_segments(directory: Path = SHM_DIR) -> list[Path]:
    """Unlink the MPICH segments this process maps. Call it only after every rank of the job
    has finished MPI_Init (e.g. after a collective on COMM_WORLD): a rank still starting
    would otherwise create a fresh segment and wait there for its peers forever."""
    removed = []
    for path in sorted(mapped_segments([Path("/proc/self/maps")], directory)):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:  # another local rank was first
            pass
        except OSError:
            pass  # not ours to remove: leave it, MPI_Finalize will try again
    return removed


def remove_stale(directory: Path = SHM_DIR, min_age: float = 10.0) -> list[Path]:
    """Delete MPICH segments in `directory` that no process maps and that are at least `min_age`
    seconds old (a job between creating its segment and mapping it is not stale). Returns them."""
    if not directory.is_dir():
        return []
    candidates = [p for p in directory.iterdir() if p.name.startswith(PREFIXES)]
    if not candidates:
        return []
    in_use = segments_in_use(directory)
    now = time.time()
    removed = []
    for path in sorted(candidates):
        try:
            if path in in_use or now - path.stat().st_mtime < min_age:
                continue
            path.unlink()
            removed.append(path)
        except OSError:  # gone meanwhile, or another user's
            continue
    return removed


def report_stale(removed: list[Path]) -> None:
    """Say on stderr that stale segments were removed (nothing when there were none)."""
    if removed:
        print(f"pgc: removed {len(removed)} stale MPICH shared-memory segment(s) from {removed[0].parent} "
              "(left by killed MPI jobs; they make later jobs hang in MPI_Init)", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m pgc_mpi.shm`: remove stale MPICH start-up segments before launching a job."""
    parser = argparse.ArgumentParser(prog="python -m pgc_mpi.shm", description=main.__doc__)
    parser.add_argument("--dir", type=Path, default=SHM_DIR, help="shared-memory directory (default %(default)s)")
    parser.add_argument("--min-age", type=float, default=10.0,
                        help="only files at least this many seconds old (default %(default)s)")
    args = parser.parse_args(argv)
    report_stale(remove_stale(args.dir, args.min_age))
    return 0


if __name__ == "__main__":
    sys.exit(main())
