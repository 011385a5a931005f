"""The Slurm templates, checked as shell and submitted to a real single-node Slurm cluster.

The cluster is brought up by launch/slurm/cluster-up.sh and stopped by cluster-down.sh (by pid).
Without Slurm installed these tests skip, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import (
    assert_valid_shell,
    daemon_state_dir,
    events_of,
    sbatch_wait,
    slurm_job_gone,
    slurm_release_requeued,
    steps_of,
)

ROOT = Path(__file__).resolve().parents[2]
SLURM_DIR = ROOT / "launch" / "slurm"
SCRIPTS = sorted([*SLURM_DIR.glob("*.sbatch"), *SLURM_DIR.glob("*.sh"), ROOT / "launch" / "local.sh"])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_templates_are_valid_shell(script):
    assert_valid_shell(script)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        if os.environ.get("CI"):
            pytest.fail("Slurm is missing: CI must install slurmctld slurmd slurm-client munge")
        pytest.skip("Slurm is not installed (apt-get install slurmctld slurmd slurm-client munge)")
    # PGC_SLURM_DIR lets .ci/run stop the daemons by pid even if this test process dies
    state, made = daemon_state_dir("PGC_SLURM_DIR", "slurm")
    up = subprocess.run([str(SLURM_DIR / "cluster-up.sh"), str(state), "16"], capture_output=True, text=True,
                        timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf"), "PGC_VENV": sys.prefix,
           "MPIEXEC_TIMEOUT": "300", "OMP_NUM_THREADS": "1"}
    yield env
    subprocess.run([str(SLURM_DIR / "cluster-down.sh"), str(state)], capture_output=True, timeout=60)
    if made:
        shutil.rmtree(state, ignore_errors=True)


def _fnv1a(text: str) -> int:
    """MPICH's world id: the 32-bit FNV-1a hash of the job name (under Slurm PMI2: JOBID.STEPID)."""
    value = 2166136261
    for byte in text.encode():
        value = ((value ^ byte) * 16777619) & 0xFFFFFFFF
    return value


def _sbatch(env: dict, cwd: Path, *args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    """sbatch; with --wait, helpers.sbatch_wait's (which notices the end within a second)."""
    if "--wait" not in args:
        return subprocess.run(["sbatch", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return sbatch_wait(env, cwd, [a for a in args if a not in ("--wait", "--parsable")], timeout)[0]


def _job(env: dict, job: str) -> dict[str, str]:
    """The job's fields from `scontrol show job` (JobState, Restarts, Reason, ExitCode, ...)."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True, timeout=30)
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))


ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")


def _wait_for_job(env: dict, job: str, done, until: float, what: str, log: Path) -> dict[str, str]:
    """Poll the job until done(fields) holds, and fail saying what it was doing when it ends
    otherwise or `until` (time.monotonic()) passes."""
    while True:
        fields = _job(env, job)
        if done(fields):
            return fields
        if fields.get("JobState") not in ACTIVE or time.monotonic() > until:
            subprocess.run(["scancel", job], env=env, timeout=30)
            output = log.read_text() if log.exists() else "(no log)"
            pytest.fail(f"waiting for {what}: job {job} is {fields.get('JobState')} ({fields.get('Reason')}), "
                        f"restarts {fields.get('Restarts')}\n{output[-6000:]}")
        time.sleep(0.5)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_training_job_survives_dying_workers(slurm, tmp_path, launcher):
    """Two of 4 workers die (pgc-cr, s=1): worker 0 SIGKILLed, worker 1 exits. Under srun
    (--kill-on-bad-exit=0) the first death is ridden out within the start (a worker_lost event);
    the second leaves a step that cannot decode: the run ends with a checkpoint (exit status 5) and
    the script starts it again at once on 2 workers. Under mpiexec (-disable-auto-cleanup) the
    SIGKILL makes hydra end every rank (the run goes on from its newest checkpoint), the exit makes
    hydra's SIGUSR1 stop the run; each time the script starts it again on the workers left. Either
    way every step is recorded once. (Steps of 0.1 s, --compute-time: without them the ten steps
    between the faults took milliseconds, and on a loaded machine both happened before hydra had
    ended the first start, which then saw one restart, not two.)"""
    out = tmp_path / "run"
    env = {**slurm, "PGC_LAUNCHER": launcher, "PGC_OUT": str(out),
           "PGC_ARGS": "--scheme pgc-cr -s 1 --steps 40 --eval-every 10 --checkpoint-every 5 --compute-time 0.1 "
                       "--fault kill:0@10+die:1@20 --lost-after 2 --problem logistic"}
    proc = _sbatch(env, tmp_path, "--wait", "-n", "5", "--time=10", "--export=ALL", str(SLURM_DIR / "train.sbatch"))
    logs = "".join(p.read_text() for p in tmp_path.glob("pgc-train-*.out"))
    assert proc.returncode == 0, proc.stderr + logs
    assert [r["step"] for r in steps_of(out)] == list(range(40))
    summary = events_of(out, "summary")[0]
    assert summary["status"] == "completed" and summary["steps"] == 40
    changes = json.loads((out / "config.json").read_text())["worker_changes"]
    assert changes[-1]["workers"] == 2 and "n=2 workers" in logs and "starting it again at once" in logs
    if launcher == "srun":
        assert [(c["workers_before"], c["workers"]) for c in changes] == [(4, 2)]
        assert "worker 0 (rank 1) has not been heard from" in logs and "cannot complete: it needs lost workers" in logs
        assert [e["worker"] for e in events_of(out, "worker_lost")] == [0, 1]
    else:
        assert [(c["workers_before"], c["workers"]) for c in changes] == [(4, 3), (3, 2)]


@pytest.mark.timeout(300)
def test_training_job_starts_again_on_a_count_the_scheme_accepts(slurm, tmp_path):
    """pgc-fr with s = 1 needs a multiple of c = 2 workers. Under mpiexec one of 4 workers dies
    (hydra's SIGUSR1 stops the run): the script starts it again on 2 workers, 3 ranks, not on the
    3 workers left, which pgc-train would refuse; every step is recorded once. (A small synthetic
    problem with a delay that lets the SIGUSR1 come before the end.)"""
    out = tmp_path / "run"
    env = {**slurm, "PGC_LAUNCHER": "mpiexec", "PGC_OUT": str(out),
           "PGC_ARGS": "--scheme pgc-fr -s 1 --problem quadratic --steps 300 --delay exp:0.01 --checkpoint-every 50 "
                       "--fault die:1@100"}
    proc = _sbatch(env, tmp_path, "--wait", "-n", "5", "--time=5", "--export=ALL", str(SLURM_DIR / "train.sbatch"),
                   timeout=240)
    logs = "".join(p.read_text() for p in tmp_path.glob("pgc-train-*.out"))
    assert proc.returncode == 0, proc.stderr + logs
    assert "3 workers left, and pgc-fr with s = 1 does not run on 3" in logs, logs[-6000:]
    assert "starting it again on 2, leaving 1 out (3 ranks)" in logs and "start 2 " in logs, logs[-6000:]
    assert [r["step"] for r in steps_of(out)] == list(range(300))
    changes = json.loads((out / "config.json").read_text())["worker_changes"]
    assert [(c["workers_before"], c["workers"]) for c in changes] == [(4, 2)]


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
           "PGC_ARGS": "--steps 1000000 --delay exp:0.01 --eval-every 100 --problem logistic"}
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
    while time.monotonic() < until and not slurm_job_gone(slurm, job):
        time.sleep(0.5)
    summary = events_of(tmp_path / "run", "summary")[0]
    assert summary["status"] == "stopped by SIGUSR1" and summary["steps"] > 0
    assert "telling the ranks to stop" in "".join(p.read_text() for p in tmp_path.glob("pgc-train-*.out"))


def test_a_segment_left_by_a_killed_job_does_not_hang_the_next_one(slurm, tmp_path):
    """The start-up hang seen under srun, made to happen: kill an srun MPI job with SIGKILL (its
    /dev/shm segment stays), give the segment the name the next job's step will use, and run that
    job. Without pgc_mpi.job.shm's clean-up its ranks open the stale segment and spin in MPI_Init."""
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
    while time.monotonic() < until and not slurm_job_gone(slurm, str(job_id)):
        time.sleep(0.5)
    stale = Path(f"/dev/shm/mpich_shm_{_fnv1a(f'{job_id}.0'):x}_0")
    left = sorted({p.name for p in Path("/dev/shm").glob("mpich_shm_*")} - before)
    assert stale.exists(), f"expected the killed job to leave {stale.name}; it left {left}"
    trap = Path(f"/dev/shm/mpich_shm_{_fnv1a(f'{job_id + 1}.0'):x}_0")  # what the next job's srun step opens
    stale.rename(trap)
    os.utime(trap, (time.time() - 60, time.time() - 60))
    env = {**slurm, "PGC_LAUNCHER": "srun", "PGC_OUT": str(tmp_path / "run"),
           "PGC_ARGS": "--scheme pgc-cr -s 1 --steps 10 --eval-every 10 --problem logistic"}
    proc = _sbatch(env, tmp_path, "--wait", "--parsable", "-n", "4", "--time=3", "--export=ALL",
                   str(SLURM_DIR / "train.sbatch"), timeout=300)
    logs = "".join(p.read_text() for p in tmp_path.glob("pgc-train-*.out"))
    assert proc.stdout.strip().split(";")[0] == str(job_id + 1), "another job took the planned job id"
    assert proc.returncode == 0, proc.stderr + logs
    assert "stale MPICH shared-memory segment" in logs
    assert not trap.exists()


@pytest.mark.timeout(420)  # longer than its own 330 s bound, so a stuck job is described, not cut off
def test_a_job_longer_than_its_time_limit_requeues_itself_and_resumes_until_done(slurm, tmp_path):
    """Issue 13 on Slurm's real time-limit path: --time=2 with the warning 50 s before it. Slurm
    checks time limits every 30 s and sends the warning up to one such period early, so it comes
    40-70 s into the allocation (the kill is due at 120 s); the run needs about 80 s of steps, more
    than a first allocation can give it. The run stops with a checkpoint, the script requeues the
    job, the requeued job (same id, same folder) resumes it with --resume auto and completes it.

    Two things are shortened, not emulated: Slurm holds a requeued job for its credential lifetime
    (cred_expire, 120 s) before starting it again, which the test cuts short (slurm_release_requeued);
    and the second allocation gets a 5-minute limit, so that the test ends after 2 allocations
    instead of as many as the machine's load makes it need."""
    steps = 800  # 0.1 s each (--compute-time): the warning always comes before the run is done
    env = {k: v for k, v in slurm.items() if k not in ("PGC_OUT", "PGC_ARGS")}
    began = time.monotonic()
    proc = _sbatch(env, tmp_path, "--parsable", "-n", "3", "--time=2", "--signal=B:USR1@50", "--export=ALL",
                   str(SLURM_DIR / "train.sbatch"), "--steps", str(steps), "--compute-time", "0.1",
                   "--checkpoint-every", "100", "--eval-every", "100", timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    log, run = tmp_path / f"pgc-train-{job}.out", tmp_path / "runs" / f"slurm-{job}"  # the default folder
    until = began + 330

    _wait_for_job(env, job, lambda f: f.get("JobState") == "RUNNING", until, "the first start", log)
    started = time.monotonic()
    _wait_for_job(env, job, lambda f: f.get("JobState") == "PENDING" and f.get("Restarts", "0") != "0", until,
                  "the warning signal and the requeue", log)
    requeued = time.monotonic()
    first = log.read_text()
    assert "SIGUSR1 (the time limit is near)" in first and f"requeueing job {job}" in first, first
    assert events_of(run, "summary")[-1]["status"] == "stopped by SIGUSR1"
    done_before = len(steps_of(run))
    assert 0 < done_before < steps

    slurm_release_requeued(env, job, "TimeLimit=5")
    final = _wait_for_job(env, job, lambda f: f.get("JobState") not in ACTIVE, until, "the resumed run", log)
    ended = time.monotonic()
    output = log.read_text()
    assert final["JobState"] == "COMPLETED" and final["ExitCode"] == "0:0", output[-6000:]
    assert final["Restarts"] == "1"
    assert output.startswith(first), "the first start's log lines were lost (--open-mode=append)"
    assert f"job {job}, start 2" in output and "resumed from" in output, output[-6000:]

    assert [r["step"] for r in steps_of(run)] == list(range(steps))  # every step once, in order
    summaries = events_of(run, "summary")
    assert [s["status"] for s in summaries] == ["completed"] and summaries[0]["steps"] == steps
    recorded = json.loads((run / "config.json").read_text())
    assert recorded["resumed_from_step"] == done_before  # the checkpoint written when the warning stopped it
    provenance = recorded["provenance"]
    assert provenance["slurm"]["SLURM_JOB_ID"] == job and provenance["slurm"]["SLURM_RESTART_COUNT"] == "1"
    assert [start["slurm"]["SLURM_JOB_ID"] for start in provenance["earlier_starts"]] == [job]
    print(f"first start after {started - began:.0f} s, warning and requeue {requeued - started:.0f} s into it "
          f"({done_before} steps), resumed run done {ended - requeued:.0f} s after the requeue")


@pytest.mark.timeout(300)
def test_script_arguments_reach_pgc_train_intact_and_scancel_does_not_requeue(slurm, tmp_path):
    """pgc-train's options as the script's arguments: values with spaces and commas arrive as
    given, beside PGC_ARGS (the older way); an --out among them is the folder the script watches.
    scancel (SIGTERM) stops the run and the job for good: a job that requeued itself would come back."""
    config = tmp_path / "my configs" / "digits, short.toml"
    config.parent.mkdir()
    config.write_text("eval-every = 7\n")
    delay = "exp:0.001 + fixed:0,1:0.001"
    out = tmp_path / "run 1, digits"
    env = {k: v for k, v in slurm.items() if k != "PGC_OUT"} | {"PGC_ARGS": "--steps 1000000 --compute-time 0.05"}
    proc = _sbatch(env, tmp_path, "--parsable", "-n", "3", "--time=5", "--export=ALL", str(SLURM_DIR / "train.sbatch"),
                   "--config", str(config), "--delay", delay, "--out", str(out), timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    log = tmp_path / f"pgc-train-{job}.out"
    until = time.monotonic() + 240
    _wait_for_job(env, job, lambda f: (out / "metrics.jsonl").exists() and bool(steps_of(out)), until,
                  "the first step", log)
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["config"]["delay"] == delay and recorded["config"]["out"] == str(out)
    assert recorded["config"]["eval_every"] == 7 and recorded["config"]["steps"] == 1000000  # the file's; PGC_ARGS'
    command = recorded["provenance"]["command_line"]
    assert command[command.index("--config") + 1] == str(config), command
    subprocess.run(["scancel", job], env=env, check=True, timeout=30)
    final = _wait_for_job(env, job, lambda f: f.get("JobState") not in ACTIVE or f.get("Restarts", "0") != "0",
                          until, "the cancelled job to end", log)
    output = log.read_text()
    assert final["JobState"] == "CANCELLED" and final["Restarts"] == "0", output[-6000:]
    assert f"output in {out}" in output and "SIGTERM" in output and "requeueing" not in output, output[-6000:]


@pytest.mark.timeout(600)
def test_your_model_through_train_sbatch_as_plugins_and_as_a_script(slurm, tmp_path):
    """examples/nets.py's model, loss and data as pgc-train --model/--loss/--dataset PATH:NAME, and
    examples/custom_cnn.py (pgc_mpi.fit) as PGC_SCRIPT: both run by train.sbatch, its flags (the
    --resume auto and --out it adds among them) reaching them alike."""
    nets = ROOT / "examples" / "nets.py"
    env = {k: v for k, v in slurm.items() if k != "PGC_OUT"}
    plugins = _sbatch(env, tmp_path, "--wait", "-n", "4", "--time=10", "--export=ALL", str(SLURM_DIR / "train.sbatch"),
                      "--model", f"{nets}:make_model", "--loss", f"{nets}:focal_loss", "--dataset", f"{nets}:digits",
                      "--steps", "20", "--eval-every", "10", "--out", str(tmp_path / "plugins"))
    script_env = {**env, "PGC_SCRIPT": str(ROOT / "examples" / "custom_cnn.py")}
    script = _sbatch(script_env, tmp_path, "--wait", "-n", "5", "--time=10", "--export=ALL",
                     str(SLURM_DIR / "train.sbatch"), "--steps", "20", "--eval-every", "10", "--out",
                     str(tmp_path / "script"))
    logs = "".join(p.read_text() for p in tmp_path.glob("pgc-train-*.out"))
    assert plugins.returncode == 0 and script.returncode == 0, plugins.stderr + script.stderr + logs[-6000:]
    for run, workers in (("plugins", 3), ("script", 4)):
        summary = events_of(tmp_path / run, "summary")[0]
        assert summary["status"] == "completed" and summary["steps"] == 20
        config = json.loads((tmp_path / run / "config.json").read_text())
        assert config["workers"] == workers and config["config"]["model"].endswith("make_model")
    assert f"python {ROOT / 'examples' / 'custom_cnn.py'} --resume auto" in logs
