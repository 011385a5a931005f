"""OUT/run.lock: one run per folder, also in time.

A run (pgc-train, pgc_mpi.fit, a pgc-bench campaign) holds its output folder's lock for as long
as it writes there. Rank 0 takes it before it looks at what the folder holds (so --overwrite and
--resume decide on a folder no other run is writing to) and drops it when the run ends, also when
it is stopped by a signal; a second run on a locked folder is refused in one line that names the
holder (pgc_mpi.errors.ConfigError: exit status 2), before it writes anything.

The lock is a small JSON file (host, pid, the process's start time, user, Slurm cluster, job,
step, array task and restart count, when and by what it was taken). It appears with its content
in one step: the content is written to a temporary file in the same folder, which is then
hard-linked into place (link() fails if the name exists: an atomic "create if absent" on a local
disk, NFS, where a retransmitted LINK is recognized by the temporary file's link count, and
Lustre). We rely on nothing else: no flock/fcntl lock, which NFS may not honour, and no lock
daemon. A file system without hard links falls back to O_CREAT | O_EXCL and a write after it.

A lock left by a process that died (kill -9, a crashed node) is stale and is taken over with a
line on standard error saying whose it was:
- on the same host, when its pid is gone or belongs to another process now (the start time
  recorded in the lock differs from /proc's);
- in the same Slurm job with another restart count (a requeued job: its earlier incarnation has
  ended, since this one runs);
- of another Slurm job of this cluster that `squeue` says has ended (listed in a final state, or
  no longer known to slurmctld for a job of this user);
- empty or unreadable, and over a minute old (its run died between creating and writing it, or
  its disk refused the write); a younger empty one is a run starting there, and holds.
Anything else holds: another host and no Slurm job to ask about, a job of another cluster (job ids
are per cluster), a job `squeue` gives no answer for (an error, or not listed: hidden from other
users by PrivateData). The message says to delete the lock file once its holder has ended.

A takeover is one taker's: it first creates a takeover marker named after the stale lock's
identity (its inode, mtime and content), with the same atomic create; only the marker's creator
checks that the lock is still the stale one, moves it away (and puts back anything else it moved)
and tries to create its own lock again, like any other run. A taker reads its own token back
after creating its lock. So of several runs taking over one stale lock at once, exactly one holds
it, and a takeover never removes a fresh lock. A marker older than a minute (its taker died in
the milliseconds it is held) is removed.

pgc-bench holds each run folder's lock and passes its token to its pgc-train (INHERIT); pgc-train's
rank 0 then rewrites the lock, with the same token, to name itself: the process that writes is the
one judged alive, also when pgc-bench was killed; it writes pgc-bench's record back when it ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

NAME = "run.lock"
# A run started by a process that holds its folder's lock for it (pgc-bench launching pgc-train)
# finds the lock's token in this variable and runs under that lock instead of refusing.
INHERIT = "PGC_RUN_LOCK"
STALE_AFTER = 60.0  # seconds: an empty or unreadable lock, or a takeover marker, this old was left by a dead run
_SLURM = {"job": "SLURM_JOB_ID", "step": "SLURM_STEP_ID", "array_job": "SLURM_ARRAY_JOB_ID",
          "array_task": "SLURM_ARRAY_TASK_ID", "restarts": "SLURM_RESTART_COUNT", "cluster": "SLURM_CLUSTER_NAME"}
# squeue's final job states (a job lingers in them for MinJobAge after its end)
_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
          "OUT_OF_MEMORY", "SPECIAL_EXIT"}


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
              "uid": os.getuid(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": what,
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
        parts.append(f"Slurm job {job}" + (f" of cluster {holder['cluster']}" if holder.get("cluster") else ""))
    parts.append(f"since {holder.get('started', '?')}")
    return ", ".join(parts)


def _squeue_says(job: str) -> str | None:
    """What squeue says of job `job`: "running" (listed in a state that is not final), "ended"
    (listed in final states only), "unknown job" (slurmctld no longer knows it: purged after its
    end, or hidden from this user), None (no answer: no squeue, an error, or not listed)."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return "unknown job" if "nvalid job id" in done.stderr else None
    states = done.stdout.split()
    if not states:
        return None
    return "ended" if set(states) <= _ENDED else "running"


def judge(holder: dict[str, Any], age: float = 0.0) -> tuple[bool, str]:
    """(whether a lock's holder has certainly ended, why): the reason it is stale, or what keeps it
    held ("" when it runs). `holder` is the lock's content ({}: empty or unreadable), `age` the
    seconds since the lock file was last written."""
    if not holder:
        if age >= STALE_AFTER:
            old = f"{age:.0f} s" if age < 120 else f"{age / 60:.0f} minutes"
            return True, (f"it is empty or unreadable and {old} old (its run died while starting, or its disk "
                          f"refused the write)")
        return False, "being written"
    mine = holder_record("")
    if holder.get("host") == mine["host"] and isinstance(holder.get("pid"), int):
        pid = holder["pid"]
        if not _alive(pid):
            return True, f"process {pid} has ended"
        if holder.get("process_start") and _process_start(pid) not in (None, holder["process_start"]):
            return True, f"process {pid} has ended (its pid belongs to another process now)"
        return False, ""
    job = holder.get("job")
    if not job:
        return False, ""
    if holder.get("cluster") and holder["cluster"] != mine.get("cluster"):
        return False, (f"Slurm job {job} belongs to cluster {holder['cluster']}, which cannot be asked from here "
                       f"(this is {mine.get('cluster') or 'no Slurm job'})")
    if job == mine.get("job"):
        if holder.get("restarts", "0") != mine.get("restarts", "0"):
            return True, f"Slurm job {job} was requeued since"
        return False, ""
    said = _squeue_says(str(job))
    if said == "ended" or (said == "unknown job" and holder.get("uid", mine["uid"]) == mine["uid"]):
        return True, f"Slurm job {job} has ended"
    if said != "running":
        return False, f"squeue gives no answer for Slurm job {job}"
    return False, ""


def _look(path: Path) -> tuple[dict[str, Any], tuple[int, int, bytes], float] | None:
    """A lock file's (content, identity, age in seconds): the content is {} when empty or
    unreadable (damaged, or being written by an older version); the identity (inode, mtime, bytes)
    tells this file from a later one of the same name. None when there is none."""
    try:
        with path.open("rb") as fh:
            stat, raw = os.fstat(fh.fileno()), fh.read()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            stat, raw = path.stat(), b""
        except FileNotFoundError:
            return None
    try:
        value = json.loads(raw.decode())
    except ValueError:
        value = {}
    content = value if isinstance(value, dict) else {}
    return content, (stat.st_ino, stat.st_mtime_ns, raw), max(0.0, time.time() - stat.st_mtime)


def _read(path: Path) -> dict[str, Any] | None:
    """A lock file's content ({} when empty or unreadable); None when gone."""
    seen = _look(path)
    return None if seen is None else seen[0]


@dataclass
class RunLock:
    """A held lock on a folder: `release()` when the run ends."""

    path: Path
    record: dict[str, Any]
    created_folder: bool = False
    inherited: bool = False  # the parent's (INHERIT): it releases it
    parent: dict[str, Any] = field(default_factory=dict)  # an inherited lock's record before this run took it on

    @property
    def token(self) -> str:
        """The lock's token (what a child run is given in INHERIT)."""
        return str(self.record["token"])

    def release(self) -> None:
        """Delete the lock if it is still ours (and the folder, if taking the lock made it and
        nothing else was written there); an inherited lock gets its parent's record back."""
        _HELD.discard(self)
        held = _read(self.path)
        if held and held.get("token") == self.record["token"]:
            if self.inherited:
                with contextlib.suppress(OSError):
                    _write_over(self.path, self.parent)
            else:
                self.path.unlink(missing_ok=True)
        if self.created_folder:
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()

    def __hash__(self) -> int:
        return id(self)


_HELD: set[RunLock] = set()  # this process's locks: released before an abort ends it (release_all)


def _temporary(path: Path, record: dict[str, Any]) -> Path:
    """A new file beside `path` holding `record`, written through to the disk."""
    tmp = path.with_name(f"{path.name}.tmp-{secrets.token_hex(6)}")
    with tmp.open("x") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return tmp


def _create(path: Path, record: dict[str, Any]) -> bool:
    """Create `path` holding `record` if there is none, content and all in one step (a temporary
    file linked into place); whether this call did."""
    tmp = _temporary(path, record)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:  # NFS: a retransmitted LINK fails although the first one succeeded
            return os.stat(tmp).st_nlink == 2
        except OSError:  # no hard links on this file system: create, then write
            return _create_then_write(path, record)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _create_then_write(path: Path, record: dict[str, Any]) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return True


def _write_over(path: Path, record: dict[str, Any]) -> None:
    """Replace `path`'s content with `record` in one step (a temporary file renamed over it)."""
    tmp = _temporary(path, record)
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:  # a lost race with another taker: look again
        try:
            made = _create(path, record)
        except OSError as exc:
            raise _unwritable(out, path, flag, exc) from None
        if made:
            if (_read(path) or {}).get("token") == record["token"]:  # ours: read back
                lock = RunLock(path, record, created)
                _HELD.add(lock)
                return lock
            continue
        seen = _look(path)
        if seen is None:
            continue  # released meanwhile
        holder, identity, age = seen
        if holder and holder.get("token") == os.environ.get(INHERIT):
            return _inherit(path, holder, what)
        ended, why = judge(holder, age)
        if not ended:
            raise ConfigError(_refusal(out, holder, flag, why))
        try:
            taken = _take_over(path, identity)
        except OSError as exc:
            raise _unwritable(out, path, flag, exc) from None
        if taken:
            left_by = f" left by {describe(holder)}" if holder else ""
            sys.stderr.write(f"{what}: taking over the lock of {out}{left_by}: {why}\n")
            sys.stderr.flush()
        else:
            time.sleep(0.01)  # another run is taking it over
    raise ConfigError(f"{flag} {out}: its lock file {path} keeps changing (several runs starting there at once?); "
                      f"choose another {flag}")


def _unwritable(out: Path, path: Path, flag: str, exc: OSError) -> ConfigError:
    return ConfigError(f"{flag} {out}: its lock file {path} cannot be written ({exc.strerror}); free space or "
                       f"fix the permissions there, or choose another {flag}")


def _inherit(path: Path, parent: dict[str, Any], what: str) -> RunLock:
    """Run under the parent's lock (INHERIT), which from now on names this process (same token)."""
    record = {**holder_record(what), "token": parent["token"], "for": describe(parent)}
    try:
        _write_over(path, record)
    except OSError:
        record = parent  # judged by the parent, as before
    lock = RunLock(path, record, inherited=True, parent=parent)
    _HELD.add(lock)
    return lock


def _identity(path: Path) -> tuple[int, int, bytes] | None:
    seen = _look(path)
    return None if seen is None else seen[1]


def _take_over(path: Path, identity: tuple[int, int, bytes]) -> bool:
    """Remove the stale lock whose identity is `identity`, if this call is the one taker that
    creates its takeover marker; whether it removed it."""
    digest = hashlib.sha256(repr(identity).encode()).hexdigest()[:16]
    marker = path.with_name(f"{NAME}.takeover-{digest}")
    if not _create(marker, holder_record("takeover")):
        with contextlib.suppress(OSError):  # a taker that died in the milliseconds it holds a marker
            if time.time() - marker.stat().st_mtime > STALE_AFTER:
                marker.unlink()
        return False
    try:
        if _identity(path) != identity:
            return False  # taken over already (and perhaps locked afresh)
        aside = path.with_name(f"{NAME}.stale-{secrets.token_hex(4)}")
        try:
            path.rename(aside)
        except FileNotFoundError:
            return False
        if _identity(aside) != identity:  # not the stale lock: put it back (fails if yet another one holds)
            with contextlib.suppress(OSError):
                os.link(aside, path)
            aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        return True
    finally:
        marker.unlink(missing_ok=True)


def _refusal(out: Path, holder: dict[str, Any], flag: str, why: str = "") -> str:
    """The one line that refuses a run a held folder."""
    if not holder:
        return (f"{flag} {out} is locked by a run starting there (its {NAME} is being written); wait for it, or "
                f"choose another {flag} (if no run is using it, delete {out / NAME})")
    if why:
        return (f"{flag} {out} is in use by another run ({describe(holder)}) as far as can be told: {why}; wait for "
                f"it to end or choose another {flag} (once you have checked that it has ended, delete {out / NAME})")
    return (f"{flag} {out} is in use by another run ({describe(holder)}); wait for it to end or choose another "
            f"{flag} (if that run has ended, e.g. its node failed, delete {out / NAME})")


def release_all() -> None:
    """Release every lock this process holds (before MPI_Abort ends it without Python's clean-up)."""
    for lock in list(_HELD):
        lock.release()
