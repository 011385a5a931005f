"""OUT/run.lock: a folder another run is writing to is refused, a dead holder's lock is taken over,
a child run inherits its parent's lock (pgc_mpi.runs.run_lock)."""

from __future__ import annotations

import errno
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

import pytest

from pgc_mpi.commands.bench import main as bench
from pgc_mpi.errors import ConfigError
from pgc_mpi.runs import run_lock


def _write_lock(out, **fields):
    out.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": "2026-01-01T00:00:00Z",
              "by": "pgc-train", "token": "t0", **fields}
    (out / run_lock.NAME).write_text(json.dumps(record))
    return record


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_a_held_folder_is_refused_naming_its_holder_and_released_after(tmp_path):
    out = tmp_path / "run"
    lock = run_lock.acquire(out, "pgc-train")
    held = json.loads((out / "run.lock").read_text())
    assert held["pid"] == os.getpid() and held["host"] == socket.gethostname() and held["by"] == "pgc-train"
    with pytest.raises(ConfigError) as err:
        run_lock.acquire(out, "pgc-train")
    text = str(err.value)
    assert f"--out {out} is in use by another run (pgc-train, pid {os.getpid()} on {socket.gethostname()}" in text
    assert f"delete {out / 'run.lock'}" in text and "\n" not in text
    lock.release()
    assert not out.exists()  # the lock made the folder and nothing else was written there
    again = run_lock.acquire(out, "pgc-train")
    (out / "config.json").write_text("{}")
    again.release()
    assert (out / "config.json").exists() and not (out / "run.lock").exists()


def test_a_dead_processs_lock_is_taken_over_with_a_line(tmp_path, capsys):
    out = tmp_path / "run"
    _write_lock(out, pid=_dead_pid())
    lock = run_lock.acquire(out, "pgc-train")
    assert f"taking over the lock of {out} left by pgc-train" in capsys.readouterr().err
    assert json.loads((out / "run.lock").read_text())["token"] == lock.token
    assert not list(out.glob("run.lock.stale-*"))
    lock.release()


def test_a_zombie_holder_has_ended(tmp_path):
    out = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # exits, and stays a zombie until waited for
    while run_lock._proc_stat(child.pid)[0] != "Z":
        pass
    _write_lock(out, pid=child.pid)
    run_lock.acquire(out, "pgc-train").release()
    child.wait()


def test_a_reused_pid_is_told_apart_by_its_start_time(tmp_path):
    out = tmp_path / "run"
    _write_lock(out, process_start="1")  # our pid, but not our process: the holder has ended
    run_lock.acquire(out, "pgc-train").release()
    _write_lock(out, process_start=run_lock._process_start(os.getpid()))
    with pytest.raises(ConfigError, match="in use by another run"):
        run_lock.acquire(out, "pgc-train")


@pytest.fixture
def squeue(tmp_path, monkeypatch):
    """A fake `squeue` first on PATH: answer(stdout, stderr, exit status) sets what it says."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "squeue"
    script.write_text('#!/bin/sh\nd=$(dirname "$0")\ncat "$d/out"; cat "$d/err" >&2; exit "$(cat "$d/rc")"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def answer(out: str = "", err: str = "", rc: int = 0) -> None:
        for name, text in (("out", out), ("err", err), ("rc", str(rc))):
            (bin_dir / name).write_text(text)

    return answer


INVALID = "slurm_load_jobs error: Invalid job id specified\n"


def test_slurm_holders_on_other_nodes(tmp_path, monkeypatch, squeue):
    out = tmp_path / "run"
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _write_lock(out, host="node9", job="77")  # this job before its requeue: it has ended
    run_lock.acquire(out, "pgc-train").release()
    _write_lock(out, host="node9", job="77", restarts="1")  # this very job, another step: running
    with pytest.raises(ConfigError, match="Slurm job 77"):
        run_lock.acquire(out, "pgc-train")
    for ended in ({"err": INVALID, "rc": 1}, {"out": "COMPLETED\n"}, {"out": "CANCELLED\nFAILED\n"}):
        squeue(**ended)  # purged after its end, or listed in final states only
        _write_lock(out, host="node9", job="12")
        run_lock.acquire(out, "pgc-train").release()
    squeue(out="RUNNING\n")
    _write_lock(out, host="node9", job="12")
    with pytest.raises(ConfigError, match=r"node9, Slurm job 12, since [^)]*\); wait for it"):
        run_lock.acquire(out, "pgc-train")
    # no answer: not listed (hidden by PrivateData), an error, or no squeue at all: held, and said so
    for silent in ({"out": ""}, {"err": "slurm_load_jobs error: Unable to contact slurm controller\n", "rc": 1}):
        squeue(**silent)
        with pytest.raises(ConfigError, match="squeue gives no answer for Slurm job 12; .*once you have checked"):
            run_lock.acquire(out, "pgc-train")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="squeue gives no answer for Slurm job 12"):
        run_lock.acquire(out, "pgc-train")
    _write_lock(out, host="node9")  # another host, no job: nobody can tell, so it holds
    with pytest.raises(ConfigError, match="if that run has ended"):
        run_lock.acquire(out, "pgc-train")


def test_a_job_of_another_cluster_or_user_is_not_judged_ended(tmp_path, monkeypatch, squeue):
    out = tmp_path / "run"
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "here")
    lock = run_lock.acquire(out, "pgc-train")
    assert json.loads((out / "run.lock").read_text())["cluster"] == "here"
    lock.release()
    squeue(err=INVALID, rc=1)  # what this cluster's squeue says of a job id it does not know
    _write_lock(out, host="node9", job="12", cluster="there")
    with pytest.raises(ConfigError) as err:
        run_lock.acquire(out, "pgc-train")
    assert "Slurm job 12 of cluster there" in str(err.value) and "belongs to cluster there" in str(err.value)
    assert f"once you have checked that it has ended, delete {out / 'run.lock'}" in str(err.value)
    _write_lock(out, host="node9", job="5", restarts="1", cluster="there")  # the same job id on another cluster
    with pytest.raises(ConfigError, match="belongs to cluster there"):
        run_lock.acquire(out, "pgc-train")
    _write_lock(out, host="node9", job="12", cluster="here", uid=os.getuid() + 1)  # may be hidden from us
    with pytest.raises(ConfigError, match="squeue gives no answer"):
        run_lock.acquire(out, "pgc-train")
    _write_lock(out, host="node9", job="12", cluster="here", uid=os.getuid())  # ours, purged: ended
    run_lock.acquire(out, "pgc-train").release()


def test_a_young_empty_lock_holds_an_old_one_is_taken_over(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    path = out / "run.lock"
    path.write_text("")
    with pytest.raises(ConfigError, match="being written"):
        run_lock.acquire(out, "pgc-train")
    for left in ("", "{not json"):  # killed between creating and writing it; damaged
        path.write_text(left)
        old = time.time() - 600
        os.utime(path, (old, old))
        lock = run_lock.acquire(out, "pgc-train")
        line = capsys.readouterr().err
        assert line.count("\n") == 1 and f"taking over the lock of {out}: it is empty or unreadable and 10 " \
            "minutes old" in line
        assert json.loads(path.read_text())["token"] == lock.token
        lock.release()


def test_three_takers_of_one_stale_lock_leave_exactly_one_holder(tmp_path, monkeypatch):
    judge = run_lock.judge

    def slow_judge(holder, age=0.0):  # widen the window between judging a lock and taking it over
        time.sleep(random.random() * 0.003)
        return judge(holder, age)

    monkeypatch.setattr(run_lock, "judge", slow_judge)
    dead = _dead_pid()
    for attempt in range(30):
        out = tmp_path / f"run{attempt}"
        _write_lock(out, pid=dead)
        barrier, won, refused = threading.Barrier(3), [], []

        def take(i, out=out, barrier=barrier, won=won, refused=refused):
            barrier.wait()
            try:
                won.append(run_lock.acquire(out, f"taker {i}"))
            except ConfigError as exc:
                refused.append(str(exc))

        threads = [threading.Thread(target=take, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(refused) == 2, (won, refused)
        assert all("is in use by another run (taker" in r for r in refused)
        assert json.loads((out / "run.lock").read_text())["token"] == won[0].token
        assert sorted(p.name for p in out.iterdir()) == ["run.lock"]  # no marker, no temporary file left
        won[0].release()


def test_a_child_inherits_its_parents_lock_and_leaves_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    parent = run_lock.acquire(out, "pgc-bench")
    monkeypatch.setenv(run_lock.INHERIT, parent.token)
    child = run_lock.acquire(out, "pgc-train")
    child.release()
    assert json.loads((out / "run.lock").read_text())["token"] == parent.token
    parent.release()
    assert not (out / "run.lock").exists()


def test_an_inherited_lock_is_judged_by_the_child_that_writes(tmp_path, monkeypatch):
    out = tmp_path / "run"
    parent = _write_lock(out, pid=_dead_pid(), by="pgc-bench", token="bench-token")  # pgc-bench, killed since
    monkeypatch.setenv(run_lock.INHERIT, "bench-token")
    child = run_lock.acquire(out, "pgc-train")
    held = json.loads((out / "run.lock").read_text())
    assert held["token"] == "bench-token" and held["pid"] == os.getpid() and held["by"] == "pgc-train"
    monkeypatch.delenv(run_lock.INHERIT)
    with pytest.raises(ConfigError, match=f"in use by another run \\(pgc-train, pid {os.getpid()}"):
        run_lock.acquire(out, "pgc-train")  # the child runs: its folder is not taken from it
    child.release()
    assert json.loads((out / "run.lock").read_text()) == parent  # the parent's record is back


def test_release_leaves_another_runs_lock(tmp_path):
    out = tmp_path / "run"
    lock = run_lock.acquire(out, "pgc-train")
    _write_lock(out, token="someone-else")
    lock.release()
    assert json.loads((out / "run.lock").read_text())["token"] == "someone-else"


def test_a_lock_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    def full(path, record):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(run_lock, "_temporary", full)
    with pytest.raises(ConfigError) as err:
        run_lock.acquire(tmp_path / "run", "pgc-train")
    assert "its lock file" in str(err.value) and "cannot be written (Disk quota exceeded)" in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "run" / "run.lock").exists()


def test_a_file_as_out_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        run_lock.acquire(tmp_path / "f", "pgc-train")


def test_pgc_bench_never_writes_into_a_run_folder_another_run_holds(tmp_path, capsys):
    exp = tmp_path / "exp.toml"
    exp.write_text('name = "lock"\nworkers = 3\nbackend = "sim"\nschemes = ["dgd"]\ns = [1]\nseeds = [0]\n'
                   '[train]\nsteps = 4\ncompute_time = 0.01\ndataset = "digits"\nmodel = "logreg"\n')
    run = tmp_path / "out" / "dgd-s1-seed0"
    holder = run_lock.acquire(run, "pgc-train")  # e.g. a second campaign on the same --out
    assert bench([str(exp), "--out", str(tmp_path / "out")]) == 2
    assert f"run folder {run} is in use by another run (pgc-train, pid {os.getpid()}" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["run.lock"]  # no run.toml, no log.txt
    holder.release()
    assert bench([str(exp), "--out", str(tmp_path / "out")]) == 0
    assert not (run / "run.lock").exists() and (run / "metrics.jsonl").is_file()


def test_slurm_array_tasks_get_a_folder_each_by_default(monkeypatch):
    from pgc_mpi.runs.run_folder import default_out

    monkeypatch.setenv("SLURM_JOB_ID", "901")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "900")
    folders = set()
    for task in ("0", "1"):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", task)
        folders.add(default_out("pgc-cr"))
    assert len(folders) == 2
