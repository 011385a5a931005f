"""OUT/run.lock: one run per folder, also in time.

A run (pgc-train, pgc_mpi.fit, a pgc-bench campaign) holds its output folder's lock for as long
as it writes there. Rank 0 takes it before it looks at what the folder holds (so --overwrite and
--resume decide on a folder no other run is writing to) and drops it when the run ends, also when
it is stopped by a signal; a second run on a locked folder is refused in one line that names the
holder (pgc_mpi.errors.ConfigError: exit status 2), before it writes anything.

The lock is a small JSON file (host, pid, the process's start time, Slurm job/step/array task and
restart count, when and by what it was taken) created with O_CREAT | O_EXCL: an atomic "create
if absent" on a local disk, and on NFS (v3 and later: the client sends an exclusive CREATE) and
Lustre. We rely on nothing else: no flock/fcntl lock, which NFS may not honour, and no lock
daemon. The file is written once, after it was created, so a reader may briefly find it empty;
an empty or unreadable lock counts as held.

A lock left by a process that died (kill -9, a crashed node) is stale and is taken over with a
warning saying whose it was:
- on the same host, when its pid is gone or belongs to another process now (the start time
  recorded in the lock differs from /proc's);
- in the same Slurm job with another restart count (a requeued job: its earlier incarnation has
  ended, since this one runs);
- of another Slurm job that `squeue` no longer lists (ended, or unknown to this cluster).
Anything else (another host and no Slurm job to ask about) is held: the message says to delete
the lock file if its holder has ended. A takeover renames the stale file away (an atomic rename:
of two runs taking over at once, one wins), checks that what it moved is the lock it judged, and
creates its own with O_EXCL again.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

NAME = "run.lock"
# A run started by a process that holds its folder's lock for it (pgc-bench launching pgc-train)
# finds the lock's token in this variable and runs under that lock instead of refusing.
INHERIT = "PGC_RUN_LOCK"
_SLURM = {"job": "SLURM_JOB_ID", "step": "SLURM_STEP_ID", "array_job": "SLURM_ARRAY_JOB_ID",
          "array_task": "SLURM_ARRAY_TASK_ID", "restarts": "SLURM_RESTART_COUNT"}


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces): [0] is the
    state, [19] the start time in clock ticks since boot; None where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def _process_start(pid: int) -> str | None:
    """The start time of process `pid` (it tells a pid reused by another process apart)."""
    fields = _proc_stat(pid)
    return fields[19] if fields else None


def _alive(pid: int) -> bool:
    """Whether process `pid` runs: it exists and is not a zombie (a killed rank whose parent died
    with it stays one where nothing reaps orphans, e.g. a container without an init)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    fields = _proc_stat(pid)
    return not (fields and fields[0] in ("Z", "X"))


def holder_record(what: str) -> dict[str, Any]:
    """This process's lock content."""
    record = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid()),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": what,
              "token": secrets.token_hex(8)}
    record.update({key: os.environ[var] for key, var in _SLURM.items() if os.environ.get(var)})
    return record


def describe(holder: dict[str, Any]) -> str:
    """The holder in a few words: 'pgc-train, pid 123 on node1, Slurm job 77, since 2026-...'."""
    job = holder.get("job")
    if holder.get("array_job") and holder.get("array_task"):
        job = f"{holder['array_job']}_{holder['array_task']}"
    parts = [str(holder.get("by", "a run")), f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"]
    if job:
        parts.append(f"Slurm job {job}")
    parts.append(f"since {holder.get('started', '?')}")
    return ", ".join(parts)


def _squeue_lists(job: str) -> bool | None:
    """Whether Slurm still lists job `job` (None: no squeue to ask)."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:  # "Invalid job id specified": ended long enough ago to be purged
        return False if "nvalid job" in done.stderr else None
    return bool(done.stdout.strip())


def stale_reason(holder: dict[str, Any]) -> str | None:
    """Why a lock's holder has certainly ended (None: it may be running)."""
    mine = holder_record("")
    if holder.get("host") == mine["host"] and isinstance(holder.get("pid"), int):
        pid = holder["pid"]
        if not _alive(pid):
            return f"process {pid} has ended"
        if holder.get("process_start") and _process_start(pid) not in (None, holder["process_start"]):
            return f"process {pid} has ended (its pid belongs to another process now)"
        return None
    job = holder.get("job")
    if not job:
        return None
    if job == mine.get("job"):
        if holder.get("restarts", "0") != mine.get("restarts", "0"):
            return f"Slurm job {job} was requeued since"
        return None
    listed = _squeue_lists(str(job))
    return f"Slurm job {job} has ended" if listed is False else None


def _read(path: Path) -> dict[str, Any] | None:
    """A lock file's content ({} when empty or unreadable: being written, or damaged); None when gone."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class RunLock:
    """A held lock on a folder: `release()` when the run ends."""

    path: Path
    record: dict[str, Any]
    created_folder: bool = False
    inherited: bool = False  # the parent's (INHERIT): it releases it

    @property
    def token(self) -> str:
        return str(self.record["token"])

    def release(self) -> None:
        """Delete the lock if it is still ours (and the folder, if taking the lock made it and
        nothing else was written there)."""
        _HELD.discard(self)
        if self.inherited:
            return
        held = _read(self.path)
        if held and held.get("token") == self.record["token"]:
            self.path.unlink(missing_ok=True)
        if self.created_folder:
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()

    def __hash__(self) -> int:
        return id(self)


_HELD: set[RunLock] = set()  # this process's locks: released before an abort ends it (release_all)


def _create(path: Path, record: dict[str, Any]) -> bool:
    """Create the lock file with `record` if there is none (atomically); whether this call did."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return True


def acquire(out: Path, what: str, flag: str = "--out") -> RunLock:
    """Take `out`'s lock for this process (creating `out` if needed), or ConfigError naming its
    holder. A stale lock is taken over, with a line on standard error saying whose it was."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag} {out} is a file, not a folder; choose another {flag}")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag} {out} cannot be created ({exc.strerror}); choose another {flag}") from None
    path = out / NAME
    record = holder_record(what)
    for _ in range(5):  # a lost race with another taker: look again
        if _create(path, record):
            lock = RunLock(path, record, created)
            _HELD.add(lock)
            return lock
        holder = _read(path)
        if holder is None:
            continue  # released meanwhile
        if holder and holder.get("token") == os.environ.get(INHERIT):
            return RunLock(path, holder, inherited=True)
        reason = stale_reason(holder) if holder else None
        if reason is None:
            raise ConfigError(_refusal(out, holder, flag))
        if _take_over(path, holder):
            sys.stderr.write(f"{what}: taking over the lock of {out} left by {describe(holder)}: {reason}\n")
            sys.stderr.flush()
    raise ConfigError(f"{flag} {out}: its lock file {path} keeps changing (several runs starting there at once?); "
                      f"choose another {flag}")


def _take_over(path: Path, stale: dict[str, Any]) -> bool:
    """Move the stale lock away; False when what was moved is not it (another run took it over
    first and its fresh lock went instead: that one is put back)."""
    aside = path.with_name(f"{NAME}.stale-{secrets.token_hex(4)}")
    try:
        path.rename(aside)
    except FileNotFoundError:
        return False
    moved = _read(aside)
    if moved is not None and moved.get("token") != stale.get("token"):
        with contextlib.suppress(OSError):  # fails if yet another lock exists: then that one holds
            os.link(aside, path)
        aside.unlink(missing_ok=True)
        return False
    aside.unlink(missing_ok=True)
    return True


def _refusal(out: Path, holder: dict[str, Any], flag: str) -> str:
    if not holder:
        return (f"{flag} {out} is locked by a run starting there (its {NAME} is being written); wait for it, or "
                f"choose another {flag} (if no run is using it, delete {out / NAME})")
    return (f"{flag} {out} is in use by another run ({describe(holder)}); wait for it to end or choose another "
            f"{flag} (if that run has ended, e.g. its node failed, delete {out / NAME})")


def release_all() -> None:
    """Release every lock this process holds (before MPI_Abort ends it without Python's clean-up)."""
    for lock in list(_HELD):
        lock.release()
