"""Launching bounded mpiexec jobs from tests, and asking Slurm about the jobs tests submit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from pgc_mpi.job import shm
from pgc_mpi.runs.metrics import read_metrics
from pgc_mpi.runs.results import read_steps

BIN = Path(sys.executable).parent
MPIEXEC = str(BIN / "mpiexec")


def mpi_env(timeout: int = 120) -> dict[str, str]:
    """Environment for an mpiexec from a test: hydra kills the job after `timeout` seconds."""
    env = dict(os.environ)
    env["MPIEXEC_TIMEOUT"] = str(timeout)
    env["OMP_NUM_THREADS"] = "1"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def mpich_segments() -> set[str]:
    """MPICH start-up segments in /dev/shm now (see pgc_mpi.job.shm)."""
    return {p.name for p in Path("/dev/shm").glob("mpich_*")} if Path("/dev/shm").is_dir() else set()


def leaked_segments(before: set[str]) -> set[str]:
    """Segments that appeared since `before` and that no process maps: left behind by a job that
    ended. (A segment some other MPI job on the machine is using right now is not a leak.)"""
    new = mpich_segments() - before
    if not new:
        return set()
    in_use = shm.segments_in_use()
    return {name for name in new if Path("/dev/shm") / name not in in_use}


def run_logistic(workers: int, batch_size: int, seed: int):
    """The problem `pgc-train --problem logistic` builds on `workers` workers with the default
    --samples and --dim (what a test replays such a run on)."""
    from pgc_mpi.config import SYNTHETIC_DEFAULTS
    from pgc_mpi.learning.problems import Logistic

    return Logistic(workers, **SYNTHETIC_DEFAULTS, batch_size=batch_size, seed=seed)


def run_train(ranks: int, args: list[str], timeout: int = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`mpiexec -n RANKS python -m pgc_mpi train ARGS`, bounded by MPIEXEC_TIMEOUT and a subprocess timeout.

    However the job ends (finished, stopped, aborted, a rank killed), it must not leave an MPICH
    start-up segment in /dev/shm: a leaked one hangs a later job in MPI_Init (pgc_mpi.job.shm).
    """
    return run_mpi(ranks, ["-m", "pgc_mpi", "train", *args], timeout, cwd)


def run_mpi(ranks: int, python_args: list[str], timeout: int = 120,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`mpiexec -n RANKS python PYTHON_ARGS` (a module or a user's script), bounded as run_train's."""
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, *python_args]
    before = mpich_segments()
    proc = subprocess.run(cmd, env=mpi_env(timeout), capture_output=True, text=True, timeout=timeout + 30, cwd=cwd)
    leaked = leaked_segments(before)
    assert not leaked, f"the job left MPICH shared-memory segments behind: {sorted(leaked)}\n{proc.stderr[-2000:]}"
    return proc


def assert_valid_shell(script: Path) -> None:
    """`bash -n` accepts the script and shellcheck finds nothing (skipped without shellcheck, except
    in CI, which must install it)."""
    import shutil

    import pytest

    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).returncode == 0
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing: CI must install it")
        pytest.skip("shellcheck is not installed")
    check = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def require_fashion_mnist() -> None:
    """Skip without Debian's dataset-fashion-mnist, except in CI, where it must be installed."""
    import pytest

    from data_prep.__main__ import FASHION_DIR

    if not FASHION_DIR.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{FASHION_DIR} missing: CI must install dataset-fashion-mnist")
        pytest.skip("dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)")


def steps_of(out: Path) -> list[dict]:
    """The per-step records of a run's metrics.jsonl, with their per-message lists from messages.bin."""
    return read_steps(out)


def events_of(out: Path, event: str) -> list[dict]:
    """The records of one event kind ('eval', 'summary', 'shutdown')."""
    return [r for r in read_metrics(out / "metrics.jsonl") if r.get("event") == event]


def start_train(ranks: int, args: list[str], out: Path, wait: float = 90) -> subprocess.Popen:
    """Start `mpiexec -n RANKS python -m pgc_mpi train ARGS --out OUT` in the background (bounded by
    MPIEXEC_TIMEOUT) and return once its first step record is in OUT/metrics.jsonl (or `wait`
    seconds have passed). The caller signals or waits for it and reads its pipes."""
    return start_mpi(ranks, ["-m", "pgc_mpi", "train", *args, "--out", str(out)], out, wait)


def start_mpi(ranks: int, python_args: list[str], out: Path, wait: float = 90) -> subprocess.Popen:
    """`mpiexec -n RANKS python PYTHON_ARGS` in the background, returned as start_train's, once the
    run in OUT has its first step record."""
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, *python_args]
    proc = subprocess.Popen(cmd, env=mpi_env(120), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    until = time.monotonic() + wait
    while time.monotonic() < until and not ((out / "metrics.jsonl").exists() and steps_of(out)):
        time.sleep(0.2)
    return proc


def slurm_job_state(env: dict, job: str) -> str:
    """The job's state as squeue shows it, '' once it has left the queue, and 'UNKNOWN' when squeue
    itself failed (a busy slurmctld times out): a failed query must never read as a job that ended,
    or a test that waits for the end goes on (and cancels) while the job still runs."""
    proc = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T"], env=env, capture_output=True, text=True,
                          timeout=30)
    if proc.returncode == 0:
        return proc.stdout.strip()
    return "" if "Invalid job id" in proc.stderr else "UNKNOWN"


def slurm_release_requeued(env: dict, job: str, *updates: str) -> None:
    """Start a requeued job now instead of after Slurm's hold (its credential lifetime, 120 s), with
    any other `scontrol update` fields (e.g. "TimeLimit=5"). The requeue revoked the job's credential
    on every node, and a node refuses a new one made within the same second (Slurm compares whole
    seconds: "Job credential revoked", or srun's "failed to send temp kvs"), so it waits a few first."""
    time.sleep(3)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now", *updates], env=env, check=True, timeout=30)


SLURM_FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                  "OUT_OF_MEMORY")


def sbatch_wait(env: dict, cwd: Path, args: list[str], timeout: float, poll: float = 1.0,
                cancel_if=None) -> tuple[subprocess.CompletedProcess, bool]:
    """`sbatch --wait` that notices the job's end within `poll` seconds. sbatch --wait looks 2, 10,
    42, 74, ... s after submitting (it backs off to 32 s): a job that ends at 11 s costs 42 s, and
    a suite of Slurm tests spends minutes waiting for jobs that have ended. The job is submitted
    with --parsable and its records (every task of an array) read with scontrol until all have
    finished. returncode is sbatch --wait's: the largest exit status, 1 for a job ended by a signal.
    The job is cancelled when `timeout` passes (subprocess.TimeoutExpired) or `cancel_if()` holds
    (True beside the result); stdout is sbatch's (the job id)."""
    cmd = ["sbatch", "--parsable", *args]
    submit = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    if submit.returncode != 0:
        return submit, False
    job = submit.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while True:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True,
                               timeout=30)
        records = [dict(field.split("=", 1) for field in line.split() if "=" in field)
                   for line in shown.stdout.splitlines() if line.strip()]
        if shown.returncode == 0 and records and all(r.get("JobState") in SLURM_FINISHED for r in records):
            codes = [r.get("ExitCode", "1:0").split(":") for r in records]
            code = max(1 if signal != "0" else int(status) for status, signal in codes)
            return subprocess.CompletedProcess(cmd, code, submit.stdout, submit.stderr), False
        if cancel_if is not None and cancel_if():
            subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30)
            return subprocess.CompletedProcess(cmd, 1, submit.stdout, submit.stderr), True
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30)
            raise subprocess.TimeoutExpired(cmd, timeout, submit.stdout, shown.stdout)
        time.sleep(poll)


def slurm_job_gone(env: dict, job: str) -> bool:
    """Whether the job has left the queue or finished (COMPLETED/FAILED/CANCELLED/TIMEOUT linger a while)."""
    return slurm_job_state(env, job) in ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY")


def daemon_state_dir(variable: str, name: str) -> tuple[Path, bool]:
    """The folder a test cluster keeps its daemons' state in: $VARIABLE when set (.ci/run sets it,
    to take the daemons down even if the tests die), else a new folder under /tmp that the
    daemons' own users (munge, slurm) can enter: pytest's temporary folders are root's, mode 0700,
    and munged refuses a log file it cannot check. Returns (folder, whether the caller made it and
    removes it afterwards)."""
    import tempfile

    given = os.environ.get(variable)
    if given:
        return Path(given), False
    folder = Path(tempfile.mkdtemp(prefix=f"pgc-{name}-", dir="/tmp"))
    folder.chmod(0o755)
    return folder, True
