"""benchmarks/gpu_check.sh --dry-run, so that the GPU checks cannot rot unseen on a project without a GPU.

The real checks only run on a GPU machine, which CI never is. Their dry run takes every step of the
real run that a CPU can take (each import, the device selection, the collection of the GPU tests,
the resnet18 rows of benchmarks/gpu_check.py at toy sizes): a module that moves or a function that
is renamed fails here, not on the day a GPU is found.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import assert_valid_shell

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
TIMEOUT = 240  # seconds; the dry run takes 10-20 s on 2 cores, most of it importing torch four times


def run_script(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run gpu_check.sh with `args` and this interpreter's environment first on PATH (the script calls
    `python`, which must be the one running the tests even when no virtual environment is activated).

    The script runs in a session of its own, so that a timeout kills it with the pytest and python
    processes it started, not bash alone."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    with subprocess.Popen(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the script's own process group: what it started
            stdout, stderr = proc.communicate()
            pytest.fail(f"gpu_check.sh {' '.join(args)} ran past {timeout} s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_the_dry_run_takes_every_cpu_step():
    done = run_script("--dry-run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("gpu_check: DRY RUN: nothing runs on a GPU and no GPU figure is measured\n"), out[:500]
    assert "MPI CUDA-aware: " in out and "--device auto: worker on " in out  # the device-selection step
    # pytest collected the GPU tests (every one skips without a GPU, so collection is what can break)
    assert "tests/runtime/test_gpu.py: " in out and "tests/runtime/test_devices.py: " in out
    # every row of the benchmark, the cuda ones on the CPU
    for row in ("| cpu |", "| cuda, pinned staging (dry run: on the cpu) |",
                "| cuda, pageable staging (dry run: on the cpu) |"):
        assert row in out, out[-3000:]
    assert out.rstrip().endswith(
        "gpu_check: DRY RUN passed: every import and CPU-side step ran; no GPU figure was measured"), out[-3000:]


def test_an_unknown_argument_is_refused():
    done = run_script("--dryrun", timeout=30)
    assert done.returncode == 2 and "usage: bash benchmarks/gpu_check.sh [--dry-run]" in done.stderr


def test_the_script_is_valid_shell():
    assert_valid_shell(SCRIPT)
