"""Fault injection under mpiexec: kill and resume, hung and faulty workers, corrupt checkpoints.

Every job is bounded (MPIEXEC_TIMEOUT and a subprocess timeout).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pytest

from pgc_mpi.core.message import MessageRecord

from helpers import MPIEXEC, events_of, leaked_segments, mpi_env, mpich_segments, run_train, steps_of

BASE = ["--dtype", "float64", "--eval-every", "1000", "--batch-size", "16", "--lr", "0.3", "--seed", "5"]


def test_killed_and_resumed_run_equals_an_uninterrupted_one(tmp_path):
    """dgd in float64 with no stragglers: kill -9 the job after a checkpoint, resume it, and get
    the same parameters, step for step, as a run that was never interrupted."""
    whole = tmp_path / "whole"
    proc = run_train(4, ["--scheme", "dgd", "--steps", "24", "--record-params", "--out", str(whole), *BASE])
    assert proc.returncode == 0, proc.stderr[-2000:]
    cut = tmp_path / "cut"
    cmd = [MPIEXEC, "-n", "4", sys.executable, "-m", "pgc_mpi", "train", "--scheme", "dgd", "--steps", "1000000",
           "--checkpoint-every", "6", "--delay", "fixed:0:0.05", "--out", str(cut), *BASE]
    segments = mpich_segments()
    job = subprocess.Popen(cmd, env=mpi_env(120), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    until = time.monotonic() + 90
    while time.monotonic() < until and len(list((cut / "checkpoints").glob("ckpt-*.h5"))) < 2:
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGKILL)  # the whole job dies at once, mid-step: no goodbye
    job.wait(timeout=30)
    assert not leaked_segments(segments)  # nothing left in /dev/shm to hang a later job (pgc_mpi.job.shm)
    latest = sorted((cut / "checkpoints").glob("ckpt-*.h5"))[-1]
    at = int(latest.stem.split("-")[1])
    # the same run resumed (its delay too: a resume must describe the same run; dgd's trajectory ignores it)
    proc = run_train(4, ["--scheme", "dgd", "--steps", "24", "--resume", "latest", "--record-params",
                         "--delay", "fixed:0:0.05", "--out", str(cut), *BASE])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"resumed from {latest}" in proc.stderr
    steps = [r["step"] for r in steps_of(cut)]
    assert steps == list(range(24))  # nothing duplicated, nothing missing
    resumed = np.load(cut / "params.npy")  # the resumed part: w_at .. w_24
    expected = np.load(whole / "params.npy")[at:]
    assert resumed.shape == expected.shape
    assert np.abs(resumed - expected).max() < 1e-12


def test_pipelined_resume_rebuilds_the_stale_buffers_by_a_warmup(tmp_path):
    proc = run_train(5, ["--scheme", "pgc-cr", "-s", "1", "--steps", "10", "--checkpoint-every", "5",
                         "--out", str(tmp_path), *BASE])
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_train(5, ["--scheme", "pgc-cr", "-s", "1", "--steps", "16", "--resume", "latest",
                         "--out", str(tmp_path), *BASE])
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = steps_of(tmp_path)
    assert [r["step"] for r in steps] == list(range(16))
    first = steps[10]  # right after the resume: buffers from the warm-up, stamped with step 9's schedule
    for versions in first["versions"].values():
        assert sorted(versions) == [9, 10]
    assert events_of(tmp_path, "eval")[-1]["test_accuracy"] > 0.5


@pytest.mark.parametrize("ranks,s,steps,hangs", [(5, 1, 40, {2: 5}), (7, 2, 30, {1: 3, 4: 8})],
                         ids=["one-hung", "s-hung"])
def test_up_to_s_hung_workers_do_not_stop_a_coded_run(tmp_path, ranks, s, steps, hangs):
    """pgc-cr with one hung worker, and with s: the run ends on time, the hung workers ({worker:
    the step it hangs at}) are abandoned at the end and named, and none is used after it hung."""
    began = time.monotonic()
    delay = "+".join(f"hang:{worker}@{step}" for worker, step in hangs.items())
    proc = run_train(ranks, ["--scheme", "pgc-cr", "-s", str(s), "--steps", str(steps), "--delay", delay,
                             "--problem", "logistic", "--grace", "3", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.monotonic() - began < 90
    assert events_of(tmp_path, "summary")[0]["steps"] == steps
    hung = sorted(hangs)
    assert sorted(events_of(tmp_path, "shutdown")[0]["abandoned"]) == hung
    assert f"workers {hung} (ranks {[w + 1 for w in hung]})" in proc.stderr
    records = steps_of(tmp_path)
    assert all(worker not in r["used"] for worker, step in hangs.items() for r in records[step + 1:])


@pytest.mark.parametrize("fault", ["nan", "inf", "badsize"])
def test_garbage_from_a_worker_never_enters_the_model(tmp_path, fault):
    proc = run_train(5, ["--scheme", "pgc-cr", "-s", "1", "--steps", "20", "--fault", f"{fault}:2@4",
                         "--problem", "logistic", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = steps_of(tmp_path)
    assert all(2 not in r["used"] for r in steps[4:])
    assert sum(MessageRecord._make(m).verdict == "rejected" for r in steps for m in r["messages"]) >= 10
    summary = events_of(tmp_path, "summary")[0]
    assert summary["rejected_messages"] >= 10 and np.isfinite(summary["final_val_loss"])
    reason = "NaN or Inf" if fault != "badsize" else "bytes, expected"
    assert "rejected a message from worker 2 (rank 3): " in proc.stderr and reason in proc.stderr


def test_more_faulty_workers_than_s_fall_to_the_deadline_policy(tmp_path):
    proc = run_train(5, ["--scheme", "pgc-cr", "-s", "1", "--steps", "20", "--fault", "nan:1@3+nan:2@3",
                         "--problem", "logistic", "--deadline", "1", "--on-deadline", "fail", "--out", str(tmp_path)],
                     timeout=90)
    assert proc.returncode != 0
    assert "could not decode by the deadline" in proc.stderr


# The dying-worker test decides on what it sees, in two phases with bounds of their own. Reaching
# the fault's step is start-up and training, whose time depends on the machine: DEATH_WITHIN is
# generous. Ending the job once the worker has died is hydra's auto-cleanup alone: the proxy sees
# the rank's PMI socket close and SIGKILLs every rank of its node at once (the ranks cannot catch
# or delay SIGKILL), measured at 0.1 s, 5 runs of 5, with 2 to 4 CPU burners on 2 cores. Its bound,
# END_AFTER_DEATH, is stretched by the machine's load (runnable processes per core) so that a
# starved CI runner is not taken for a hydra that never acts.
DEATH_WITHIN = 150.0
END_AFTER_DEATH = 15.0


def _load_factor() -> float:
    """How oversubscribed the machine is: the 1-minute load average per core, at least 1."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def test_a_dying_worker_ends_a_plain_mpiexec_job_and_the_checkpoint_survives(tmp_path):
    """Plain mpiexec (hydra's auto-cleanup) ends the job when a rank dies (launch/local.sh does
    not: see the next test). pgc-cr would train on without the dead worker, so the run is far
    longer than the job may last (with 1000 steps a run once finished first and exited 0), and
    hydra's end of the job, not the run's or MPIEXEC_TIMEOUT's, is what the test waits for: first
    the dying worker's line, then the job's end, each within its own bound (see DEATH_WITHIN). A
    failure says which of the two did not come. Three ranks of the quadratic problem: the rule is
    the same as with more, and start-up costs a third of a five-rank digits job."""
    segments = mpich_segments()
    cmd = [MPIEXEC, "-n", "3", sys.executable, "-m", "pgc_mpi", "train", "--problem", "quadratic", "--scheme",
           "pgc-cr", "-s", "1", "--steps", "100000", "--checkpoint-every", "5", "--fault", "die:1@12",
           "--out", str(tmp_path), *BASE]
    # one stream: the ranks' log (stderr) and hydra's reports (stdout), in order
    job = subprocess.Popen(cmd, env=mpi_env(int(DEATH_WITHIN + 60)), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    died = threading.Event()

    def read() -> None:  # as it comes: the death is seen the moment it is logged
        for line in job.stdout:
            lines.append(line)
            if "injected fault: this worker dies now" in line:
                died.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not died.wait(DEATH_WITHIN):
            pytest.fail(f"the worker did not reach its fault step (12) within {DEATH_WITHIN:.0f} s (start-up "
                        f"or training too slow, or stuck); the job's output ends:\n{''.join(lines)[-2000:]}")
        bound = END_AFTER_DEATH * _load_factor()
        try:
            job.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            pytest.fail(f"hydra did not end the job within {bound:.0f} s of the worker's death (load factor "
                        f"{_load_factor():.1f}); the job's output ends:\n{''.join(lines)[-2000:]}")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
        reader.join(timeout=30)
    # hydra's exit status is the dying rank's (17) or a killed rank's (9), and its "BAD TERMINATION"
    # report comes only with the latter (measured: about half of the runs each): neither is the sign
    # of hydra's clean-up, the end within END_AFTER_DEATH of the death is (MPIEXEC_TIMEOUT is far later)
    assert job.returncode != 0, "".join(lines)[-2000:]
    checkpoints = sorted((tmp_path / "checkpoints").glob("ckpt-*.h5"))
    assert checkpoints and int(checkpoints[-1].stem.split("-")[1]) >= 5
    assert not leaked_segments(segments)


def test_corrupt_and_mismatched_checkpoints_are_clear_errors(tmp_path):
    """Rules, not scale: the quadratic problem on 2 workers (3 on the elastic resume) keeps its six
    short jobs cheap."""
    q = ["--problem", "quadratic"]
    proc = run_train(3, [*q, "--scheme", "gc-cr", "--steps", "4", "--checkpoint-every", "2", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = sorted((tmp_path / "checkpoints").glob("ckpt-*.h5"))[-1]
    # into the checkpoint's own folder, the folder's config.json refuses another run first ...
    other = run_train(3, [*q, "--scheme", "pgc-cr", "--steps", "8", "--resume", str(ckpt)], timeout=60)
    assert other.returncode != 0 and "describes another run: scheme 'gc-cr' (this run: 'pgc-cr')" in other.stderr
    # ... and resumed into a new folder (a fork), the checkpoint itself does
    fork = str(tmp_path / "fork")
    other = run_train(3, [*q, "--scheme", "pgc-cr", "--steps", "8", "--resume", str(ckpt), "--out", fork], timeout=60)
    assert other.returncode != 0 and "the checkpoint is for scheme = 'gc-cr', this run has 'pgc-cr'" in other.stderr
    wider = run_train(4, [*q, "--scheme", "gc-cr", "--steps", "8", "--resume", str(ckpt), "--out", fork], timeout=60)
    assert wider.returncode == 0 and "resuming at step 4 with 3 workers, not the checkpoint's 2" in wider.stderr
    with h5py.File(ckpt, "a") as f:
        del f["params"]
    broken = run_train(3, [*q, "--scheme", "gc-cr", "--steps", "8", "--resume", str(ckpt)], timeout=60)
    assert broken.returncode != 0 and "incomplete checkpoint" in broken.stderr
    ckpt.write_bytes(b"\x89HDF garbage")
    junk = run_train(3, [*q, "--scheme", "gc-cr", "--steps", "8", "--resume", str(ckpt)], timeout=60)
    assert junk.returncode != 0 and "not a readable checkpoint" in junk.stderr
    for proc in (other, broken, junk):
        assert "Traceback" not in proc.stderr and proc.stderr.count("error") == 1


@pytest.mark.parametrize("death", ["die", "kill"])
def test_local_sh_starts_a_run_that_lost_a_worker_again_on_the_workers_left(tmp_path, death):
    """mpiexec -disable-auto-cleanup. A worker that exits: hydra tells the ranks with SIGUSR1, the
    master stops with a checkpoint at the step in progress. A worker SIGKILLed: hydra ends every
    rank, and the newest periodic checkpoint (step 100) is where the run goes on, or, when the
    master has taken hydra's SIGUSR1 (sent to every rank when one's PMI socket closes) before the
    kill reached it, its stop checkpoint at the step in progress (seen with 2 CPU burners on 2 cores:
    step 101). Either way local.sh starts the run again at once on 2 workers; every step is
    recorded once and the worker change is in config.json."""
    from pathlib import Path

    out = tmp_path / "run"
    local = Path(__file__).resolve().parents[2] / "launch" / "local.sh"
    proc = subprocess.run([str(local), "3", "--problem", "quadratic", "--scheme", "pgc-cr", "--steps", "300",
                           "--delay", "exp:0.005", "--checkpoint-every", "20", "--fault", f"{death}:1@100",
                           "--out", str(out)], env=mpi_env(90), capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "this worker dies now" in proc.stderr and "starting it again at once on the 2 left" in proc.stderr
    assert [r["step"] for r in steps_of(out)] == list(range(300))
    change = json.loads((out / "config.json").read_text())["worker_changes"]
    assert len(change) == 1 and change[0]["workers_before"] == 3 and change[0]["workers"] == 2
    if death == "die":
        assert "SIGUSR1 received during step" in proc.stderr and 100 <= change[0]["step"] <= 150
    else:
        assert "the job ended with status" in proc.stderr and 100 <= change[0]["step"] <= 150
    assert [e["status"] for e in events_of(out, "summary")] == ["completed"]  # a resume cuts earlier summaries


def test_local_sh_starts_again_on_a_count_the_scheme_accepts_or_says_why_none(tmp_path):
    """pgc-fr with s = 1 needs a multiple of c = 2 workers: of 4, one dies and local.sh starts the
    run again on 2 of the 3 left (not 3, which pgc-train would refuse), every step recorded once.
    gc-cr with s = 2 needs more than 2: of 3, one dies, no count fits, and local.sh says why and
    what to run instead in one line and exits with the run's status (3: stopped by SIGUSR1).
    (The delay keeps each run going until hydra's SIGUSR1 tells it of the death: without a
    restart, both schemes would ride it out to the end.)"""
    from pathlib import Path

    local = Path(__file__).resolve().parents[2] / "launch" / "local.sh"
    common = ["--problem", "quadratic", "--steps", "300", "--delay", "exp:0.01", "--checkpoint-every", "50"]
    out = tmp_path / "fr"
    # worker 2 dies: the restart on 2 workers has no worker 2, and its fault, which has happened, is dropped
    proc = subprocess.run([str(local), "4", "--scheme", "pgc-fr", "-s", "1", *common, "--fault", "die:2@100",
                           "--out", str(out)],
                          env=mpi_env(90), capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("3 workers left, and pgc-fr with s = 1 does not run on 3 (pgc-fr needs n divisible by c = 2"
            in proc.stderr and "starting it again on 2, leaving 1 out" in proc.stderr), proc.stderr[-3000:]
    assert [r["step"] for r in steps_of(out)] == list(range(300))
    change = json.loads((out / "config.json").read_text())["worker_changes"]
    assert [(c["workers_before"], c["workers"]) for c in change] == [(4, 2)]
    assert [e["status"] for e in events_of(out, "summary")] == ["completed"]

    out = tmp_path / "cr"
    proc = subprocess.run([str(local), "3", "--scheme", "gc-cr", "-s", "2", *common, "--fault", "die:1@100",
                           "--out", str(out)],
                          env=mpi_env(90), capture_output=True, text=True, timeout=150)
    assert proc.returncode == 3, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "not restarting it" in line]
    assert len(said) == 1, proc.stderr[-3000:]
    assert "2 workers left and gc-cr with s = 2 runs on none of 1..2 (on 2: s must be smaller than n" in said[0]
    assert said[0].endswith(f"resume it on 3 workers (4 ranks), the fewest above 2 that it runs on: the same "
                            f"options with --resume auto --out {out}")
    assert [e["status"] for e in events_of(out, "summary")] == ["stopped by SIGUSR1"]  # started once
