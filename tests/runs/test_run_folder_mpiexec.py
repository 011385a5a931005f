"""Run folders under mpiexec: a reused --out is refused, --overwrite replaces the run, --resume auto
continues a killed run with every step recorded exactly once, and config.json's provenance."""

from __future__ import annotations

import json
import socket
import subprocess
import time

from helpers import events_of, run_train, start_train, steps_of

ARGS = ["--steps", "40", "--checkpoint-every", "10", "--delay", "exp:0.05", "--eval-every", "10"]


def test_a_reused_out_is_refused_and_overwrite_replaces_the_run(tmp_path):
    logistic = ["--problem", "logistic"]  # the folder's rules, not the model's: no torch in the workers
    assert run_train(4, [*logistic, "--steps", "6", "--out", str(tmp_path)]).returncode == 0
    before = (tmp_path / "metrics.jsonl").read_text()
    proc = run_train(4, [*logistic, "--steps", "4", "--seed", "2", "--out", str(tmp_path)])
    assert proc.returncode == 2
    assert f"--out {tmp_path} already holds a run" in proc.stderr and "--overwrite" in proc.stderr
    assert (tmp_path / "metrics.jsonl").read_text() == before  # untouched
    proc = run_train(4, [*logistic, "--steps", "4", "--seed", "2", "--overwrite", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["step"] for r in steps_of(tmp_path)] == [0, 1, 2, 3]
    assert len(events_of(tmp_path, "summary")) == 1
    config = json.loads((tmp_path / "config.json").read_text())
    start = config["provenance"]
    assert config["config"]["seed"] == 2 and start["command_line"][-3:] == ["--overwrite", "--out", str(tmp_path)]
    assert start["hosts"] == [socket.gethostname()] * 4 and start["started_utc"].endswith("Z")
    assert start["versions"]["mpi_library"].startswith("MPICH") and "torch" in start["versions"]
    assert start["git_commit"] is None or len(start["git_commit"].split("-")[0]) == 40


def test_resume_auto_continues_a_killed_run_with_every_step_once(tmp_path):
    """... also when the newest checkpoint is damaged: the resume falls back to the one before,
    says so, and cuts metrics.jsonl at that checkpoint's step, not the newest one's."""
    out = tmp_path / "run"
    proc = start_train(4, [*ARGS, "--resume", "auto"], out, wait=60)  # nothing there yet: a fresh start
    until = time.monotonic() + 90
    while time.monotonic() < until and len(list((out / "checkpoints").glob("ckpt-*.h5"))) < 2:
        time.sleep(0.1)
    proc.kill()  # as if the node went away: no rank shuts down cleanly
    subprocess.run(["pkill", "-9", "-f", "--", f"--out {out}"], check=False)  # its ranks too
    proc.wait(timeout=30)
    written = [r["step"] for r in steps_of(out)]
    found = sorted((out / "checkpoints").glob("ckpt-*.h5"))
    assert len(found) >= 2 and not events_of(out, "summary")
    newest, previous = found[-1], found[-2]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit: the digest refuses it
    newest.write_bytes(bytes(data))
    proc = run_train(4, [*ARGS, "--resume", "auto", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{newest}: damaged or incomplete checkpoint" in proc.stderr
    assert f"resuming from {previous} (step {int(previous.stem[5:])}), the newest intact" in proc.stderr
    assert f"taking over the lock of {out} left by pgc-train" in proc.stderr  # its rank 0 was killed
    assert not (out / "run.lock").exists()
    steps = [r["step"] for r in steps_of(out)]
    assert steps == list(range(40)), (written, steps)
    assert [r["status"] for r in events_of(out, "summary")] == ["completed"]
    config = json.loads((out / "config.json").read_text())
    assert config["resumed_from_step"] == int(previous.stem[5:]) >= 10
    assert len(config["provenance"]["earlier_starts"]) == 1
    again = run_train(4, [*ARGS, "--resume", "auto", "--seed", "9", "--out", str(out)])
    assert again.returncode == 2 and "describes another run: seed 0 (this run: 9)" in again.stderr


def test_a_second_run_on_a_folder_in_use_is_refused_and_the_first_is_one_run(tmp_path):
    """Two submissions of one batch script at once: before run.lock, both ran to exit 0 and the
    folder held both runs' steps and two summaries under the second one's config.json."""
    out = tmp_path / "run"
    args = ["--problem", "quadratic", "--steps", "400", "--delay", "exp:0.01", "--eval-every", "100"]
    first = start_train(3, args, out)
    until = time.monotonic() + 60
    while time.monotonic() < until and not (out / "metrics.jsonl").is_file():
        time.sleep(0.05)
    for extra in ([], ["--overwrite"], ["--resume", "auto"]):
        proc = run_train(3, [*args, "--seed", "5", *extra, "--out", str(out)])
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"--out {out} is in use by another run (pgc-train, pid" in proc.stderr
        assert first.poll() is None, "the first run must still be running: make it longer"
    assert first.wait(timeout=120) == 0
    assert [r["step"] for r in steps_of(out)] == list(range(400))
    assert len(events_of(out, "summary")) == 1 and not (out / "run.lock").exists()
    assert json.loads((out / "config.json").read_text())["config"]["seed"] == 0


def test_a_checkpoint_resumes_on_fewer_workers_with_the_change_recorded(tmp_path):
    """An elastic restart: the run continues on the workers that are left (here 3 of 4), its
    placement (and pbs's table) rebuilt for the new n, every step recorded once."""
    for scheme in ("pgc-cr", "pbs"):
        out = tmp_path / scheme
        args = ["--problem", "quadratic", "--scheme", scheme, "--checkpoint-every", "10", "--out", str(out)]
        assert run_train(5, [*args, "--steps", "20"]).returncode == 0
        proc = run_train(4, [*args, "--steps", "40", "--resume", "auto"])
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "resuming at step 20 with 3 workers, not the checkpoint's 4" in proc.stderr
        assert ("pbs's table starts empty" in proc.stderr) == (scheme == "pbs")
        assert [r["step"] for r in steps_of(out)] == list(range(40))
        config = json.loads((out / "config.json").read_text())
        assert config["workers"] == 3 and config["worker_changes"] == [{"step": 20, "workers_before": 4, "workers": 3}]
        assert len(config["provenance"]["earlier_starts"][0]["hosts"]) == 5
        assert {m[0] for r in steps_of(out)[20:] for m in r["messages"]} <= {0, 1, 2}
