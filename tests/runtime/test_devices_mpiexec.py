"""--device and --master-device under mpiexec on this GPU-less machine: the mapping recorded, the errors.

The CUDA path itself needs a GPU: benchmarks/gpu_check.sh runs it there.
"""

from __future__ import annotations

import json

from helpers import run_train

DIGITS = ["--scheme", "pgc-cr", "-s", "1", "--steps", "4", "--eval-every", "100"]


def test_every_rank_records_its_device_and_local_rank(tmp_path):
    out = tmp_path / "run"
    proc = run_train(4, [*DIGITS, "--device", "auto", "--master-device", "cpu", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    provenance = json.loads((out / "config.json").read_text())["provenance"]
    devices = [rank["device"] for rank in provenance["ranks"]]
    assert [d["role"] for d in devices] == ["master", "worker", "worker", "worker"]
    assert all(d["device"] == "cpu" for d in devices)  # auto without a GPU: the CPU
    # one node: the workers (auto: they would take a GPU) count out the node's GPUs among themselves,
    # the cpu master takes no share of them
    assert [(d["local_rank"], d["local_size"]) for d in devices[1:]] == [(0, 3), (1, 3), (2, 3)]
    assert (devices[0]["local_rank"], devices[0]["local_size"]) == (0, 4)
    assert {d["local_source"] for d in devices} == {"MPI shared-memory split"}
    assert provenance["mpi_cuda_aware"] is False


def test_cuda_without_a_gpu_stops_every_rank_with_one_line_each(tmp_path):
    proc = run_train(3, [*DIGITS, "--device", "cuda", "--out", str(tmp_path / "run")])
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pgc-train: error:")]
    assert len(errors) == 2 and all("--device cuda" in line and "no GPU" in line for line in errors), proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_gpu_for_a_numpy_problem_is_refused_before_anything_starts(tmp_path):
    proc = run_train(3, ["--problem", "quadratic", "--master-device", "cuda", "--out", str(tmp_path / "run")])
    assert proc.returncode == 2
    assert "--master-device cuda: --problem quadratic is computed with NumPy on the CPU" in proc.stderr
    assert not (tmp_path / "run").exists()
