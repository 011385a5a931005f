"""The Slurm templates, checked as shell and submitted to a real single-node Slurm cluster.

The cluster is brought up by launch/slurm/cluster-up.sh and stopped by cluster-down.sh (by pid).
Without Slurm installed these tests skip, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import events_of, steps_of

ROOT = Path(__file__).resolve().parents[1]
SLURM_DIR = ROOT / "launch" / "slurm"
SCRIPTS = sorted([*SLURM_DIR.glob("*.sbatch"), *SLURM_DIR.glob("*.sh"), ROOT / "launch" / "local.sh"])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_templates_are_valid_shell(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).returncode == 0
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing: CI must install it")
        pytest.skip("shellcheck is not installed")
    check = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        if os.environ.get("CI"):
            pytest.fail("Slurm is missing: CI must install slurmctld slurmd slurm-client munge")
        pytest.skip("Slurm is not installed (apt-get install slurmctld slurmd slurm-client munge)")
    # PGC_SLURM_DIR lets .ci/run stop the daemons by pid even if this test process dies
    state = Path(os.environ["PGC_SLURM_DIR"]) if os.environ.get("PGC_SLURM_DIR") else tmp_path_factory.mktemp("slurm")
    up = subprocess.run([str(SLURM_DIR / "cluster-up.sh"), str(state), "16"], capture_output=True, text=True,
                        timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf"), "PGC_VENV": sys.prefix,
           "MPIEXEC_TIMEOUT": "300", "OMP_NUM_THREADS": "1"}
    yield env
    subprocess.run([str(SLURM_DIR / "cluster-down.sh"), str(state)], capture_output=True, timeout=60)


def _fnv1a(text: str) -> int:
    """MPICH's world id: the 32-bit FNV-1a hash of the job name (under Slurm PMI2: JOBID.STEPID)."""
    value = 2166136261
    for byte in text.encode():
        value = ((value ^ byte) * 16777619) & 0xFFFFFFFF
    return value


def _sbatch(env: dict, cwd: Path, *args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    return subprocess.run(["sbatch", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_training_job(slurm, tmp_path, launcher):
    env = {**slurm, "PGC_LAUNCHER": launcher, "PGC_OUT": str(tmp_path / "run"),
           "PGC_ARGS": "--scheme pgc-cr -s 1 --steps 30 --eval-every 10"}
    proc = _sbatch(env, tmp_path, "--wait", "-n", "4", "--time=10", "--export=ALL", str(SLURM_DIR / "train.sbatch"))
    logs = "".join(p.read_text() for p in tmp_path.glob("pgc-train-*.out"))
    assert proc.returncode == 0, proc.stderr + logs
    summary = events_of(tmp_path / "run", "summary")[0]
    assert summary["status"] == "completed" and summary["steps"] == 30
    assert "n=3 workers" in logs


@pytest.mark.timeout(700)
def test_sweep_array_and_gather(slurm, tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text('name = "slurm-sweep"\nworkers = 2\nschemes = ["dgd", "pgc-cr"]\ns = [1]\ntarget_loss = 2.0\n'
                   'timeout = 300\nlauncher = "srun --mpi=pmi2 -n {ranks}"\n[train]\nsteps = 20\neval-every = 5\n')
    out = tmp_path / "out"
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    proc = subprocess.run([str(SLURM_DIR / "submit-sweep.sh"), str(exp), str(out), "--time=10"],
                          env={**slurm, "SUBMIT_WAIT": "1", "PATH": path}, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    logs = "".join(p.read_text() for p in out.glob("slurm-*.out")) if out.exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    assert "2 runs" in proc.stdout
    table = (out / "results.md").read_text()
    assert "| dgd |" in table and "| pgc-cr | 1 |" in table
    assert (out / "loss_vs_time.png").exists()
    assert len(steps_of(out / "pgc-cr-s1-seed0")) == 20


@pytest.mark.timeout(600)  # longer than its own 300 s wait, so a stuck job is described, not cut off
def test_stop_signal_through_slurm_keeps_the_metrics(slurm, tmp_path):
    env = {**slurm, "PGC_OUT": str(tmp_path / "run"), "PGC_REQUEUE": "0",
           "PGC_ARGS": "--steps 1000000 --delay exp:0.01 --eval-every 100"}
    proc = _sbatch(env, tmp_path, "--parsable", "-n", "4", "--time=10", "--export=ALL", str(SLURM_DIR / "train.sbatch"))
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    until = time.monotonic() + 300
    run = tmp_path / "run"
    while time.monotonic() < until and not ((run / "metrics.jsonl").exists() and steps_of(run)):
        time.sleep(0.5)
    if not (run / "metrics.jsonl").exists():  # say what the job was doing, then fail
        job_state = subprocess.run(["scontrol", "show", "job", job], env=slurm, capture_output=True, text=True).stdout
        procs = subprocess.run(["ps", "-eo", "pid,stat,etime,args"], capture_output=True, text=True).stdout
        subprocess.run(["scancel", job], env=slurm, timeout=30)
        output = "".join(p.read_text() for p in tmp_path.glob("pgc-train-*.out"))
        pytest.fail(f"the job produced no metrics in 300 s\n{job_state}\n{output}\n"
                    + "\n".join(line for line in procs.splitlines() if "pgc" in line or "srun" in line))
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=slurm, check=True, timeout=30)
    while time.monotonic() < until and subprocess.run(["squeue", "-h", "-j", job], env=slurm, capture_output=True,
                                                      text=True).stdout.strip():
        time.sleep(0.5)
    summary = events_of(tmp_path / "run", "summary")[0]
    assert summary["status"] == "stopped by SIGUSR1" and summary["steps"] > 0
    assert "telling the ranks to stop" in "".join(p.read_text() for p in tmp_path.glob("pgc-train-*.out"))


def test_a_segment_left_by_a_killed_job_does_not_hang_the_next_one(slurm, tmp_path):
    """The start-up hang seen under srun, made to happen: kill an srun MPI job with SIGKILL (its
    /dev/shm segment stays), give the segment the name the next job's step will use, and run that
    job. Without pgc_mpi.shm's clean-up its ranks open the stale segment and spin in MPI_Init."""
    hold = ("import os, time; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "  # past it: every rank is up
            "MPI.COMM_WORLD.rank or print(os.environ['SLURM_JOB_ID'], flush=True); time.sleep(300)")
    before = {p.name for p in Path("/dev/shm").glob("mpich_shm_*")}
    job = subprocess.Popen(["srun", "--mpi=pmi2", "-n", "4", sys.executable, "-c", hold], env=slurm,
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        job_id = int(job.stdout.readline())
        subprocess.run(["scancel", "--signal=KILL", str(job_id)], env=slurm, check=True, timeout=30)
    finally:
        job.wait(timeout=60)
    until = time.monotonic() + 60
    while time.monotonic() < until and subprocess.run(["squeue", "-h", "-j", str(job_id)], env=slurm,
                                                      capture_output=True, text=True).stdout.strip():
        time.sleep(0.5)
    stale = Path(f"/dev/shm/mpich_shm_{_fnv1a(f'{job_id}.0'):x}_0")
    left = sorted({p.name for p in Path("/dev/shm").glob("mpich_shm_*")} - before)
    assert stale.exists(), f"expected the killed job to leave {stale.name}; it left {left}"
    trap = Path(f"/dev/shm/mpich_shm_{_fnv1a(f'{job_id + 1}.0'):x}_0")  # what the next job's srun step opens
    stale.rename(trap)
    os.utime(trap, (time.time() - 60, time.time() - 60))
    env = {**slurm, "PGC_LAUNCHER": "srun", "PGC_OUT": str(tmp_path / "run"),
           "PGC_ARGS": "--scheme pgc-cr -s 1 --steps 10 --eval-every 10"}
    proc = _sbatch(env, tmp_path, "--wait", "--parsable", "-n", "4", "--time=3", "--export=ALL",
                   str(SLURM_DIR / "train.sbatch"), timeout=300)
    logs = "".join(p.read_text() for p in tmp_path.glob("pgc-train-*.out"))
    assert proc.stdout.strip().split(";")[0] == str(job_id + 1), "another job took the planned job id"
    assert proc.returncode == 0, proc.stderr + logs
    assert "stale MPICH shared-memory segment" in logs
    assert not trap.exists()
