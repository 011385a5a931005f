"""Stale MPICH start-up segments: removed only when provably stale (see pgc_mpi.job.shm): MPICH's exact name and
mode, our own, old, and neither open nor mapped by any process (by inode, and by the kernel's lease), and
never where this process cannot see every process on the node."""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pgc_mpi.job import shm

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")

ROOT = Path(__file__).resolve().parents[2]
OTHER_UID = 12345
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to chown a file to, or run as, another uid)")


def _segment(directory: Path, name: str, age: float = 60.0, mode: int = 0o600) -> Path:
    """A file as MPICH makes it (mode 0600), `age` seconds old."""
    path = directory / name
    path.write_bytes(b"\0" * 4096)
    path.chmod(mode)
    old = time.time() - age
    os.utime(path, (old, old))
    return path


@pytest.fixture
def shm_dir(tmp_path):
    """A directory standing in for /dev/shm, on the real /dev/shm (tmpfs) where there is one."""
    if not (shm.SHM_DIR.is_dir() and os.access(shm.SHM_DIR, os.W_OK | os.X_OK)):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="pgc-test-", dir=shm.SHM_DIR))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def _other_users_processes_readable(monkeypatch):
    """Run as an ordinary user, remove_stale cannot read root's processes, so it removes nothing (that rule has its
    own test, run as root). In-process tests of the other rules then pretend those processes were readable."""
    if os.geteuid() == 0:
        return
    scan = shm.scan_usage

    def readable(*args, **kwargs):
        usage = scan(*args, **kwargs)
        usage.unreadable.clear()
        return usage

    monkeypatch.setattr(shm, "scan_usage", readable)


@contextlib.contextmanager
def _holder(code: str):
    """A live process that runs `code`, which prints 'ready' once it holds its files; killed on the way out."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _map_code(*paths: Path) -> str:
    return ("import mmap, time\n"
            f"maps = []\nfor p in {[str(p) for p in paths]!r}:\n"
            "    with open(p, 'r+b') as f:\n        maps.append(mmap.mmap(f.fileno(), 4096))\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")


def test_remove_stale_keeps_mapped_young_and_foreign_files(tmp_path):
    stale = _segment(tmp_path, "mpich_shm_eb421bf2_0")
    stale_vci = _segment(tmp_path, "mpich_vci_eb421bf2_0")
    young = _segment(tmp_path, "mpich_shm_1234_0", age=0.0)
    foreign = _segment(tmp_path, "other_program_shm")
    in_use = _segment(tmp_path, "mpich_shm_beef_0")
    with open(in_use, "r+b") as f, mmap.mmap(f.fileno(), 4096) as mapped:  # a live job maps its segment
        assert shm.mapped_segments([Path("/proc/self/maps")], tmp_path) == {in_use}
        removed = shm.remove_stale(tmp_path, min_age=10.0)
        mapped[0] = 1
    assert removed == [stale, stale_vci]
    assert not stale.exists() and not stale_vci.exists()
    assert young.exists() and foreign.exists() and in_use.exists()


def test_keeps_a_file_a_live_process_holds_open_without_mapping_it(shm_dir):
    held = _segment(shm_dir, "mpich_shm_a11ce_0")
    stale = _segment(shm_dir, "mpich_shm_b0b_0")
    with _holder(f"import time\nf = open({str(held)!r}, 'rb')\nprint('ready', flush=True)\ntime.sleep(60)\n"):
        assert shm.segments_in_use(shm_dir) == {held}  # seen in /proc/<pid>/fd, not only in maps
        assert shm.remove_stale(shm_dir) == [stale]
    assert held.exists() and not stale.exists()


def test_a_deleted_mapping_protects_the_file_it_maps_not_its_old_name(shm_dir):
    """A maps line "/dev/shm/NAME (deleted)" says the mapped file lost that name, not that NAME is free: the same
    file may have it again (linked back), or a different file may. Compare files (device, inode), not names."""
    same = _segment(shm_dir, "mpich_shm_cafe_0")
    other = _segment(shm_dir, "mpich_shm_f00d_0")
    with _holder(_map_code(same, other)) as proc:
        os.link(same, shm_dir / "relink")  # the mapped file loses its name and gets it back: still in use
        same.unlink()
        os.rename(shm_dir / "relink", same)
        other.unlink()  # the mapped file loses its name for good; a new, unused file gets that name
        _segment(shm_dir, other.name)
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert f"{same} (deleted)" in maps and f"{other} (deleted)" in maps
        assert shm.remove_stale(shm_dir) == [other]
    assert same.exists() and not other.exists()


def test_only_mpichs_exact_name_and_mode(shm_dir):
    """MPICH names its segments mpich_shm_%x_%d / mpich_vci_%x_%d and creates them 0600; nothing else goes."""
    real = [_segment(shm_dir, "mpich_shm_e6281d29_0"), _segment(shm_dir, "mpich_vci_7_12"),
            _segment(shm_dir, "mpich_shm_0_3", mode=0o400)]  # a umask may take bits away
    lookalikes = [_segment(shm_dir, name) for name in (
        "mpich_shm_notes", "mpich_shm_e6281d29_0.bak", "mpich_shm_E6281D29_0", "mpich_shm_123456789_0",
        "mpich_shm_0abc_0", "mpich_shm_abc_01", "mpich_shm_abc_", "mpich_vci_abc_0_1", "mpich_shmem_abc_0")]
    text = shm_dir / "mpich_shm_deadbeef_1"  # MPICH's name, but a person's file: 0644 text
    text.write_text("notes about the hang\n")
    text.chmod(0o644)
    os.utime(text, (time.time() - 60, time.time() - 60))
    linked = _segment(shm_dir, "mpich_shm_d00d_0")
    os.link(linked, shm_dir / "keep-me")  # a second name: not a plain MPICH segment
    assert shm.remove_stale(shm_dir) == sorted(real)
    assert all(p.exists() for p in lookalikes) and text.read_text() == "notes about the hang\n" and linked.exists()


@needs_root
def test_root_leaves_other_users_files(shm_dir):
    theirs = _segment(shm_dir, "mpich_shm_5eed_0")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    mine = _segment(shm_dir, "mpich_shm_5eed_1")
    assert shm.remove_stale(shm_dir) == [mine]
    assert theirs.exists()


def test_skips_everything_with_a_notice_where_processes_are_hidden(shm_dir, monkeypatch, capsys):
    stale = _segment(shm_dir, "mpich_shm_eb421bf2_0")
    monkeypatch.setattr(shm, "visibility_problem", lambda: "processes are hidden (a test says so)")
    assert shm.remove_stale(shm_dir) == []
    assert stale.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pgc: not removing 1 possibly stale MPICH shared-memory segment")
    assert "mpich_shm_eb421bf2_0" in err and "(a test says so)" in err and "fuser -v" in err
    monkeypatch.setattr(shm, "visibility_problem", lambda: None)
    assert shm.remove_stale(shm_dir, min_age=3600) == []  # nothing old enough: no check, no notice
    assert capsys.readouterr().err == ""


def test_visibility_problem_reads_the_pid_namespace_and_hidepid(tmp_path):
    """A stand-in for /proc: self, self/ns/pid and self/mountinfo, as the kernel shows them."""
    me = tmp_path / str(os.getpid())
    (me / "ns").mkdir(parents=True)
    (tmp_path / "self").symlink_to(me.name)

    def problem(namespace: str, options: str) -> str | None:
        (me / "ns" / "pid").unlink(missing_ok=True)
        (me / "ns" / "pid").symlink_to(namespace)
        (me / "mountinfo").write_text(f"22 27 0:21 / {tmp_path} rw,relatime - proc proc rw{options}\n")
        return shm.visibility_problem(tmp_path)

    host = shm.INIT_PID_NS
    assert problem(host, "") is None and problem(host, ",hidepid=1") is None and problem(host, ",hidepid=0") is None
    assert "hidepid=2" in problem(host, ",hidepid=2") and "hidepid=invisible" in problem(host, ",hidepid=invisible")
    assert "PID namespace" in problem("pid:[4026532178]", "")
    (tmp_path / "self").unlink()
    (tmp_path / "self").symlink_to("1")  # /proc of another PID namespace: "self" is some other process
    assert "another PID namespace" in problem(host, "")
    assert "not mounted" in shm.visibility_problem(tmp_path / "absent")


def test_the_kernel_lease_protects_a_file_mapped_by_a_process_we_cannot_see(shm_dir, monkeypatch):
    """Last line of defence: a process outside our view (another PID namespace) maps it. Pretend the /proc
    scan saw nothing; the kernel still refuses the write lease, so the file stays."""
    mapped = _segment(shm_dir, "mpich_shm_abcdef_0")
    stale = _segment(shm_dir, "mpich_shm_abcdef_1")
    monkeypatch.setattr(shm, "scan_usage", lambda *args, **kwargs: shm.Usage())
    with _holder(_map_code(mapped)):
        assert shm.remove_stale(shm_dir) == [stale]
    assert mapped.exists()


def test_environment_switch_turns_the_automatic_clean_up_off(shm_dir, monkeypatch, capsys):
    stale = _segment(shm_dir, "mpich_shm_eb421bf2_0")
    for off in ("0", "false", "OFF", "no"):
        monkeypatch.setenv(shm.ENV_SWITCH, off)
        assert shm.remove_stale(shm_dir) == []
    assert stale.exists() and capsys.readouterr().err == ""
    monkeypatch.setenv(shm.ENV_SWITCH, "1")
    assert shm.remove_stale(shm_dir) == [stale]


@needs_root
def test_a_user_who_cannot_read_other_users_processes_relies_on_the_kernel_lease(shm_dir):
    """Run as an ordinary user (uid 12345): root's processes (this test's own, at least) are unreadable to it.
    The kernel's write lease, granted only when no process anywhere has the file open or mapped, decides:
    the unused segment goes, the one a root process holds open stays."""
    os.chown(shm_dir, OTHER_UID, OTHER_UID)
    stale = _segment(shm_dir, "mpich_shm_eb421bf2_0")
    held = _segment(shm_dir, "mpich_shm_eb421bf3_0")
    for path in (stale, held):
        os.chown(path, OTHER_UID, OTHER_UID)
    holder = subprocess.Popen([sys.executable, "-c", f"import time; f = open({str(held)!r}); time.sleep(60)"])
    try:
        time.sleep(0.5)  # let it open the file
        # import first: root's venv
        code = ("import os, sys\nfrom pathlib import Path\nfrom pgc_mpi.job import shm\n"
                f"os.setgroups([])\nos.setgid({OTHER_UID})\nos.setuid({OTHER_UID})\n"
                "print([p.name for p in shm.remove_stale(Path(sys.argv[1]))])\n")
        env = {k: v for k, v in os.environ.items() if k != "PGC_SHM_CLEANUP"}
        proc = subprocess.run([sys.executable, "-c", code, str(shm_dir)], capture_output=True, text=True,
                              timeout=60, cwd=ROOT, env=env)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['mpich_shm_eb421bf2_0']" and not stale.exists() and held.exists()


def _unshare_pid() -> list[str]:
    """The unshare command line for a new PID namespace with its own /proc; skips (but not in CI) without it."""
    cmd = ["unshare", "--pid", "--fork", "--mount-proc"]
    why = None
    if shutil.which("unshare") is None:
        why = "unshare (util-linux) is not installed"
    elif subprocess.run([*cmd, "true"], capture_output=True, timeout=60).returncode != 0:
        why = "unshare --pid --fork --mount-proc is not permitted here (needs root)"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI runs as root with util-linux, so this test must run there")
        pytest.skip(why)
    return cmd


def test_inside_a_pid_namespace_nothing_is_removed_and_it_says_why(shm_dir):
    cmd = _unshare_pid()
    stale = _segment(shm_dir, "mpich_shm_eb421bf2_0")
    proc = subprocess.run([*cmd, sys.executable, "-m", "pgc_mpi.job.shm", "--dir", str(shm_dir)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert stale.exists()
    assert proc.stderr.count("\n") == 1 and "pgc: not removing 1 possibly stale" in proc.stderr
    assert "PID namespace" in proc.stderr
    outside = subprocess.run([sys.executable, "-m", "pgc_mpi.job.shm", "--dir", str(shm_dir)], capture_output=True,
                             text=True, timeout=60, cwd=ROOT)  # on the host it goes
    assert "removed 1 stale MPICH shared-memory segment(s)" in outside.stderr and not stale.exists()


def test_unlink_own_segments_removes_only_what_this_process_maps(tmp_path):
    mine = _segment(tmp_path, "mpich_shm_abc_0")
    other = _segment(tmp_path, "mpich_shm_def_0")
    with open(mine, "r+b") as f, mmap.mmap(f.fileno(), 4096) as mapped:
        assert shm.unlink_own_segments(tmp_path) == [mine]
        mapped[0] = 7  # still usable after the unlink: only the name is gone
        assert mapped[0] == 7
    assert not mine.exists() and other.exists()


def test_missing_directory_is_nothing_to_do(tmp_path):
    assert shm.remove_stale(tmp_path / "absent") == []


def test_command_line_reports_what_it_removed(tmp_path):
    _segment(tmp_path, "mpich_shm_feed_0")
    env = dict(os.environ, **{shm.ENV_SWITCH: "0"})  # turns off only the automatic clean-up, not this one
    proc = subprocess.run([sys.executable, "-m", "pgc_mpi.job.shm", "--dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    if os.geteuid() != 0:  # root's processes are unreadable to an ordinary user: it removes nothing, and says so
        assert "pgc: not removing 1 possibly stale" in proc.stderr and (tmp_path / "mpich_shm_feed_0").exists()
        return
    assert "removed 1 stale MPICH shared-memory segment(s)" in proc.stderr and "mpich_shm_feed_0" in proc.stderr
    assert not (tmp_path / "mpich_shm_feed_0").exists()


def test_pgc_train_removes_what_a_killed_mpi_job_left(tmp_path):
    """The real failure: an MPI program killed with SIGKILL leaves its start-up segment in /dev/shm
    (MPICH removes it only in MPI_Finalize). pgc-train's ranks remove it before their MPI_Init."""
    if os.geteuid() != 0:
        pytest.skip("an ordinary user cannot read root's processes, so pgc-train removes nothing (by design)")
    from helpers import MPIEXEC, leaked_segments, mpi_env, mpich_segments, run_train

    hold = ("import time; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "  # past the barrier: every rank is up
            "MPI.COMM_WORLD.rank or print('up', flush=True); time.sleep(120)")
    before = mpich_segments()
    job = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-c", hold], env=mpi_env(150),
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert job.stdout.readline().strip() == "up"
    finally:
        os.killpg(job.pid, 9)
        job.wait(timeout=30)
    left = leaked_segments(before)
    if not left:
        pytest.skip("this MPI library leaves no start-up segment behind when killed")
    for name in sorted(left):  # as if the kill happened a while ago (fresh segments may be a job starting)
        with contextlib.suppress(FileNotFoundError):  # another MPI job on this machine, already gone
            os.utime(Path("/dev/shm") / name, (time.time() - 60, time.time() - 60))
    left = {name for name in left if (Path("/dev/shm") / name).exists()}
    if not left:
        pytest.skip("another process on this machine removed the killed job's segment first")
    proc = run_train(3, ["--steps", "3", "--eval-every", "3", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "stale MPICH shared-memory segment" in proc.stderr
    assert not left & mpich_segments()
