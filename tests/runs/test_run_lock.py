"""OUT/run.lock: a folder another run is writing to is refused, a dead holder's lock is taken over,
a child run inherits its parent's lock (pgc_mpi.runs.run_lock)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

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


def test_slurm_holders_on_other_nodes(tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _write_lock(out, host="node9", job="77")  # this job before its requeue: it has ended
    run_lock.acquire(out, "pgc-train").release()
    _write_lock(out, host="node9", job="77", restarts="1")  # this very job, another step: running
    with pytest.raises(ConfigError, match="Slurm job 77"):
        run_lock.acquire(out, "pgc-train")
    monkeypatch.setattr(run_lock, "_squeue_lists", lambda job: False)
    _write_lock(out, host="node9", job="12")  # another job squeue no longer lists
    run_lock.acquire(out, "pgc-train").release()
    for answer in (True, None):  # still listed, or no squeue to ask: held
        monkeypatch.setattr(run_lock, "_squeue_lists", lambda job, answer=answer: answer)
        _write_lock(out, host="node9", job="12")
        with pytest.raises(ConfigError, match="node9, Slurm job 12"):
            run_lock.acquire(out, "pgc-train")
    _write_lock(out, host="node9")  # another host, no job: nobody can tell, so it holds
    with pytest.raises(ConfigError, match="if that run has ended"):
        run_lock.acquire(out, "pgc-train")


def test_a_lock_being_written_holds(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.lock").write_text("")
    with pytest.raises(ConfigError, match="being written"):
        run_lock.acquire(out, "pgc-train")


def test_a_child_inherits_its_parents_lock_and_leaves_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    parent = run_lock.acquire(out, "pgc-bench")
    monkeypatch.setenv(run_lock.INHERIT, parent.token)
    child = run_lock.acquire(out, "pgc-train")
    child.release()
    assert json.loads((out / "run.lock").read_text())["token"] == parent.token
    parent.release()
    assert not (out / "run.lock").exists()


def test_release_leaves_another_runs_lock(tmp_path):
    out = tmp_path / "run"
    lock = run_lock.acquire(out, "pgc-train")
    _write_lock(out, token="someone-else")
    lock.release()
    assert json.loads((out / "run.lock").read_text())["token"] == "someone-else"


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
