"""MPICH's start-up shared-memory segments: unlink ours once the job is up, remove stale ones.

MPICH (4.x/5.x, ch4) creates one POSIX shared-memory file per node at MPI_Init,
/dev/shm/mpich_shm_<world id>_<node> (and, with several VCIs, mpich_vci_<world id>_<node>), where
the world id is the FNV-1a hash of the process manager's job name ("JOBID.STEPID" under Slurm's
PMI2; under hydra "kvs_<pid>_<pgid>_<rand()>_<host>" in MPICH 4.x/5.x, so a job's own name cannot
be predicted from outside it), printed with "%x" (1 to 8 lowercase hex digits), and
<node> is the node's index in the job. The node's first rank creates it with
shm_open(O_CREAT | O_EXCL, 0600) and only MPI_Finalize unlinks it, so every job that is killed or
aborted leaves its file behind. A later job whose name hashes to the same id (Slurm job ids restart
when a cluster's state is reset; process ids are reused) then opens the stale file instead of a
fresh one and hangs in MPI_Init, or fails there with garbage from the old job's queues. Measured
on this project's single-node Slurm: a job killed with SIGKILL left mpich_shm_eb421bf2_0 (the hash
of "1.0"), and the next cluster's job 1 hung in MPI_Init until the file was removed
(tests/launch/test_slurm.py makes this happen on purpose).

Two defences, both Linux-only (/proc) and no-ops elsewhere:
- `unlink_own_segments` (pgc-train's main, once the world communicator is duplicated): once every
  rank has finished MPI_Init, the segment's name is no longer needed (every local rank has it
  mapped), so each rank unlinks the names it maps. The memory lives on until the job ends, and
  nothing is left behind however the job ends.
- `remove_stale` (pgc-train's entry, on every rank before MPI_Init, so on every node; and
  `python -m pgc_mpi.job.shm` by hand): delete the segments other MPI programs left when killed. It
  deletes a file only when all of these hold, and leaves everything else alone:
  * its name is exactly MPICH's (mpich_shm_<hex id>_<node> or mpich_vci_<hex id>_<node>) and it
    looks like MPICH made it: a plain file with one link and no permission bits beyond 0600;
  * it belongs to the user running this (root removes only root's files, never another user's);
  * it is at least `min_age` seconds old (a job between creating its segment and mapping it);
  * no process this one can see has it open (/proc/<pid>/fd) or mapped (/proc/<pid>/maps),
    compared by device and inode, so a mapping whose name was unlinked ("... (deleted)" in maps)
    protects the file only if it is that very file, not a newer one with the same name;
  * the kernel grants a write lease on it (fcntl F_SETLEASE), which it does only when no other
    open file anywhere on the node refers to it: no descriptor, no mapping, in any namespace.
    The lease is held while the name is unlinked, so a process cannot start using it in between.
  And it removes nothing, saying why in one line on stderr, where this process cannot list every
  process on the node: inside a PID namespace (containers, Slurm setups that isolate jobs) or with
  /proc mounted hidepid=2. Processes it can list but not read (other users' ones, for an ordinary
  user) do not stop it: for them the kernel's lease is the proof, and a file is removed only
  when the lease is granted (an ordinary user on a cluster node is the common case, and its
  jobs are the ones a stale segment hangs). It checks all this only when there is a candidate,
  so a clean node stays silent.
  PGC_SHM_CLEANUP=0 (or false/no/off) turns the automatic clean-up off (remove_stale then does
  nothing and says nothing); `python -m pgc_mpi.job.shm` still cleans when run by hand.

This module does not import MPI: callers decide when the job is up.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import re
import signal
import stat
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PROC = Path("/proc")
ENV_SWITCH = "PGC_SHM_CLEANUP"
# MPICH's ch4 POSIX shm: sprintf(name, "mpich_shm_%x_%d", world_id, node_id), and "mpich_vci_%x_%d"
SEGMENT_NAME = re.compile(r"mpich_(?:shm|vci)_(?:0|[1-9a-f][0-9a-f]{0,7})_(?:0|[1-9][0-9]{0,9})")
INIT_PID_NS = "pid:[4026531836]"  # PROC_PID_INIT_INO: the host's (initial) PID namespace, since Linux 3.8
_DELETED = " (deleted)"
_OFF = ("0", "false", "no", "off")


def is_segment_name(name: str) -> bool:
    """Whether `name` is exactly the name MPICH gives a start-up segment."""
    return SEGMENT_NAME.fullmatch(name) is not None


def _looks_like_segment(st: os.stat_result) -> bool:
    """MPICH creates a segment with shm_open(O_CREAT | O_EXCL, 0600): a plain file, one link, at most rw for its
    owner (a umask may take bits away, never add them). A file some person wrote has 0644 or so."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and not stat.S_IMODE(st.st_mode) & ~0o600


def cleanup_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when PGC_SHM_CLEANUP is 0, false, no or off: the automatic clean-up is turned off."""
    value = (os.environ if environ is None else environ).get(ENV_SWITCH, "")
    return value.strip().lower() not in _OFF


@dataclass
class Usage:
    """What the processes we can see hold: files as (st_dev, st_ino), names as paths (not unlinked ones),
    and the pids whose open files or maps we may not read."""

    files: set[tuple[int, int]] = field(default_factory=set)
    paths: set[Path] = field(default_factory=set)
    unreadable: list[int] = field(default_factory=list)

    def uses(self, path: Path, st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino) in self.files or path in self.paths


def _real(directory: Path) -> Path:
    return Path(os.path.realpath(directory))  # /dev/shm may be a link (to /run/shm); /proc shows real paths


def _maps_entries(data: bytes) -> Iterator[tuple[int, int, str]]:
    """(st_dev, st_ino, path as shown) of each file-backed line of a /proc/<pid>/maps file."""
    for raw in data.splitlines():
        parts = raw.split(maxsplit=5)
        if len(parts) < 6 or parts[4] == b"0":
            continue
        try:
            major, minor = (int(x, 16) for x in parts[3].split(b":"))
            yield os.makedev(major, minor), int(parts[4]), os.fsdecode(parts[5])
        except ValueError:
            continue


def _add_maps(usage: Usage, data: bytes, directory: Path) -> None:
    for dev, ino, shown in _maps_entries(data):
        usage.files.add((dev, ino))
        if not shown.endswith(_DELETED) and Path(shown).parent == directory:
            usage.paths.add(Path(shown))


def _add_fds(usage: Usage, fd_dir: Path, directory: Path) -> bool:
    """Add the files open under fd_dir that could be segments; False if we may not read them."""
    try:
        fds = os.listdir(fd_dir)
    except PermissionError:
        return False
    except OSError:  # the process ended
        return True
    for fd in fds:
        link = fd_dir / fd
        try:
            target = os.readlink(link)
        except PermissionError:
            return False
        except OSError:  # closed meanwhile
            continue
        if not target.startswith("/"):  # socket:[...], pipe:[...], anon_inode:...
            continue
        deleted = target.endswith(_DELETED)
        shown = Path(target[: -len(_DELETED)] if deleted else target)
        if shown.parent != directory and not is_segment_name(shown.name):
            continue  # only stat what may be a segment: a file on a hung network file system could block
        try:
            st = os.stat(link)
        except OSError:
            continue
        usage.files.add((st.st_dev, st.st_ino))
        if not deleted:
            usage.paths.add(shown)
    return True


def scan_usage(directory: Path = SHM_DIR, proc: Path = PROC) -> Usage:
    """What every process listed in /proc has open (fd) or mapped (maps) that could be a segment in `directory`."""
    directory = _real(directory)
    usage = Usage()
    try:
        pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return usage
    for pid in pids:
        try:
            data = (proc / str(pid) / "maps").read_bytes()
        except PermissionError:
            usage.unreadable.append(pid)
            continue
        except OSError:  # the process ended
            continue
        _add_maps(usage, data, directory)
        if not _add_fds(usage, proc / str(pid) / "fd", directory):
            usage.unreadable.append(pid)
    return usage


def mapped_segments(maps_files: list[Path], directory: Path = SHM_DIR) -> set[Path]:
    """MPICH segment files under `directory` that the given /proc/<pid>/maps files map by their current name."""
    directory = _real(directory)
    found: set[Path] = set()
    for maps in maps_files:
        try:
            data = maps.read_bytes()
        except OSError:  # the process ended, or it is not ours to read
            continue
        for _, _, shown in _maps_entries(data):
            path = Path(shown)
            if not shown.endswith(_DELETED) and path.parent == directory and is_segment_name(path.name):
                found.add(path)
    return found


def segments_in_use(directory: Path = SHM_DIR) -> set[Path]:
    """MPICH segment files under `directory` that some process we can see has open or mapped now."""
    directory = _real(directory)
    try:
        entries = [Path(e.path) for e in os.scandir(directory) if is_segment_name(e.name)]
    except OSError:
        return set()
    usage = scan_usage(directory)
    in_use = set()
    for path in entries:
        try:
            if usage.uses(path, os.lstat(path)):
                in_use.add(path)
        except OSError:
            continue
    return in_use


def unlink_own_segments(directory: Path = SHM_DIR) -> list[Path]:
    """Unlink the MPICH segments this process maps. Call it only after every rank of the job
    has finished MPI_Init (e.g. after a collective on COMM_WORLD): a rank still starting
    would otherwise create a fresh segment and wait there for its peers forever."""
    removed = []
    for path in sorted(mapped_segments([PROC / "self" / "maps"], directory)):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:  # another local rank was first
            pass
        except OSError:
            pass  # not ours to remove: leave it, MPI_Finalize will try again
    return removed


def _hidepid(proc: Path) -> str | None:
    """The hidepid= value of the /proc mount when it hides processes from listings, else None."""
    try:
        lines = (proc / "self" / "mountinfo").read_text(errors="replace").splitlines()
    except OSError:
        return None
    value = None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 6 and fields[4] == str(proc) and tail and tail[0] == "proc":
            options = fields[5].split(",") + (tail[2].split(",") if len(tail) > 2 else [])
            value = next((o.partition("=")[2] for o in options if o.startswith("hidepid=")), "0")  # the last one wins
    return value if value not in (None, "0", "off", "1", "noaccess") else None  # 1 lists every process


def visibility_problem(proc: Path = PROC) -> str | None:
    """Why this process cannot list every process on the node (so cannot know who uses a segment), or None.

    Unreadable processes of other users are found by the scan itself (see remove_stale)."""
    if not proc.is_dir():
        return f"{proc} is not mounted, so no process that uses them can be seen"
    try:
        self_pid = int(os.readlink(proc / "self"))
    except (OSError, ValueError):
        self_pid = None
    if self_pid != os.getpid():
        return f"{proc} belongs to another PID namespace than this process, so it cannot tell who uses them"
    try:
        namespace = os.readlink(proc / "self" / "ns" / "pid")
    except FileNotFoundError:  # a kernel without namespaces: every process is in the one /proc
        namespace = INIT_PID_NS
    except OSError as e:
        return f"cannot read {proc}/self/ns/pid ({e.strerror}), so cannot tell whether processes are hidden from it"
    if namespace != INIT_PID_NS:
        return ("this process runs in a PID namespace (a container, or a Slurm setup that isolates jobs), "
                "where processes outside it that may use them are invisible")
    hidepid = _hidepid(proc)
    if hidepid is not None:
        return f"{proc} is mounted with hidepid={hidepid}, which hides other users' processes"
    return None


@contextlib.contextmanager
def _sigio_ignored() -> Iterator[None]:
    """Another process opening a leased file makes the kernel send the lease holder SIGIO, whose default action
    ends the process. Ignore it meanwhile (only the main thread may change signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGIO)
    if previous is None:  # installed outside Python: cannot be put back, leave it
        yield
        return
    signal.signal(signal.SIGIO, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGIO, previous)


def _unlink_unless_open(path: Path, st: os.stat_result, lease_required: bool) -> bool:
    """Unlink `path` (which was `st`) while holding a write lease on it, which the kernel grants only when no other
    open file refers to it (a descriptor or a mapping, in any process). Where leases are not supported, unlink it
    anyway unless `lease_required`. True if it was unlinked."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    with _sigio_ignored():
        try:
            fd = os.open(path, flags)
        except OSError:  # gone, replaced, or another rank holds a lease on it right now
            return False
        leased = False
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or now.st_uid != os.geteuid():
                return False
            try:
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
                leased = True
            except OSError as e:
                if e.errno == errno.EAGAIN or lease_required:  # EAGAIN: someone has it open or mapped
                    return False
            if leased:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, fcntl.F_SETOWN, 0)  # no SIGIO to anyone if an open breaks the lease
            current = os.lstat(path)
            if (current.st_dev, current.st_ino) != (st.st_dev, st.st_ino):
                return False
            os.unlink(path)
            return True
        except OSError:
            return False
        finally:
            if leased:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            os.close(fd)


def _candidates(directory: Path, min_age: float) -> list[tuple[Path, os.stat_result]]:
    """Files in `directory` named and made like MPICH's segments, owned by us and at least `min_age` seconds old."""
    uid, now = os.geteuid(), time.time()
    found = []
    try:
        entries = [e for e in os.scandir(directory) if is_segment_name(e.name)]
    except OSError:
        return []
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == uid and _looks_like_segment(st) and now - st.st_mtime >= min_age:
            found.append((Path(entry.path), st))
    return sorted(found, key=lambda c: c[0])


def skip_notice(directory: Path, names: list[str], reason: str) -> str:
    """The one line remove_stale writes on stderr when it leaves possible stale segments because of `reason`."""
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return (f"pgc: not removing {len(names)} possibly stale MPICH shared-memory segment(s) in {directory} ({shown}): "
            f"{reason}. A stale one hangs a later job in MPI_Init: where every process is visible (on the host, as "
            f"root), check that no process uses them (fuser -v {directory}/mpich_*) and rm them; "
            f"{ENV_SWITCH}=0 turns this clean-up off")


def remove_stale(directory: Path = SHM_DIR, min_age: float = 10.0, *, enabled: bool | None = None) -> list[Path]:
    """Delete the MPICH segments in `directory` that are provably stale (see the module docstring) and return them.

    `enabled`: None reads PGC_SHM_CLEANUP (0/false/no/off: do nothing). When this process cannot see every process
    on the node it removes nothing and says why in one line on stderr."""
    if enabled is None:
        enabled = cleanup_enabled()
    if not enabled or not sys.platform.startswith("linux") or not directory.is_dir():
        return []
    directory = _real(directory)
    candidates = _candidates(directory, min_age)
    if not candidates:
        return []
    problem = visibility_problem()
    usage = Usage()
    if problem is None:
        usage = scan_usage(directory)
    if problem is not None:
        print(skip_notice(directory, [p.name for p, _ in candidates], problem), file=sys.stderr, flush=True)
        return []
    removed = []
    for path, st in candidates:
        # processes this one may not read (another user's, when not root; more privileged ones, when
        # root): only the kernel's lease can speak for them, so without one nothing is removed
        if not usage.uses(path, st) and _unlink_unless_open(path, st, lease_required=bool(usage.unreadable)):
            removed.append(path)
    return removed


def report_stale(removed: list[Path]) -> None:
    """Say on stderr that stale segments were removed, and which (nothing when there were none)."""
    if removed:
        names = ", ".join(p.name for p in removed)
        print(f"pgc: removed {len(removed)} stale MPICH shared-memory segment(s) from {removed[0].parent}: {names} "
              "(left by killed MPI jobs; they make later jobs hang in MPI_Init)", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m pgc_mpi.job.shm`: remove stale MPICH start-up segments before launching a job (regardless of
    PGC_SHM_CLEANUP, which turns off only the automatic clean-up)."""
    parser = argparse.ArgumentParser(prog="python -m pgc_mpi.job.shm", description=main.__doc__)
    parser.add_argument("--dir", type=Path, default=SHM_DIR, help="shared-memory directory (default %(default)s)")
    parser.add_argument("--min-age", type=float, default=10.0,
                        help="only files at least this many seconds old (default %(default)s)")
    args = parser.parse_args(argv)
    report_stale(remove_stale(args.dir, args.min_age, enabled=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
