"""The CUDA path, on a machine with a GPU and a CUDA build of torch (benchmarks/gpu_check.sh runs
these). Without one every test here skips: CI has no GPU; the CPU side of device selection and
the staged path are tested in test_devices.py and test_devices_mpiexec.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pgc_mpi.job.devices import select_device
from pgc_mpi.learning.datasets import load_digits
from pgc_mpi.learning.torch_problem import TorchProblem

from helpers import run_train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and a CUDA build of torch")


@pytest.mark.parametrize("model", ["logreg", "cnn", "resnet18"])
def test_a_model_on_the_gpu_computes_what_it_does_on_the_cpu(model):
    cpu = TorchProblem(model, load_digits(3), 4, 16, seed=3, dtype="float64")
    gpu = TorchProblem(model, load_digits(3), 4, 16, seed=3, dtype="float64", device=torch.device("cuda", 0))
    assert gpu.flat.flat.is_cuda and gpu.flat._host.is_pinned() and gpu.flat._host_grad.is_pinned()
    w = cpu.initial_params() + 0.01
    np.testing.assert_array_equal(gpu.initial_params(), cpu.initial_params())
    loss_c, grad_c = cpu.loss_and_grad(w, 2, 1)
    loss_g, grad_g = gpu.loss_and_grad(w, 2, 1)
    assert loss_g == pytest.approx(loss_c, rel=1e-9)
    np.testing.assert_allclose(grad_g, grad_c, rtol=1e-7, atol=1e-10)
    ev_c, ev_g = cpu.evaluate(w), gpu.evaluate(w)
    assert ev_g.keys() == ev_c.keys() and all(ev_g[k] == pytest.approx(ev_c[k], rel=1e-7) for k in ev_c)


def test_cuda_is_chosen_and_auto_finds_it():
    plan = select_device("cuda", "worker", env={})
    assert plan.kind == "cuda" and plan.index == 0 and plan.torch_device() == torch.device("cuda", 0)
    assert select_device("auto", "master", env={}).kind == "cuda"


def test_a_run_on_gpus_follows_the_cpu_runs_trajectory(tmp_path):
    args = ["--scheme", "dgd", "--steps", "8", "--dtype", "float64", "--model", "cnn", "--record-params",
            "--eval-every", "4", "--share-gpus"]  # 2 workers per GPU on a one-GPU machine
    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    proc = run_train(3, [*args, "--out", str(cpu)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_train(3, [*args, "--device", "cuda", "--master-device", "cuda", "--out", str(gpu)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads((gpu / "config.json").read_text())["provenance"]["ranks"]
    assert all(r["device"]["kind"] == "cuda" for r in ranks)
    np.testing.assert_allclose(np.load(gpu / "params.npy"), np.load(cpu / "params.npy"), rtol=1e-6, atol=1e-9)


def test_more_workers_than_gpus_is_refused_without_share_gpus(tmp_path):
    workers = torch.cuda.device_count() + 1
    proc = run_train(workers + 1, ["--scheme", "dgd", "--steps", "2", "--device", "cuda", "--out", str(tmp_path / "r")])
    assert proc.returncode == 2 and "--share-gpus" in proc.stderr, proc.stderr[-3000:]
