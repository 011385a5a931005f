"""Every model trains under mpiexec with a coded scheme on real data (bounded jobs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_prep.__main__ import main as prep

from helpers import events_of, require_fashion_mnist, run_train


@pytest.fixture(scope="module")
def digits_h5(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "digits.h5"
    assert prep(["digits", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("model,steps,lr,batch", [("logreg", 30, 0.3, 32), ("mlp", 30, 0.1, 32),
                                                  ("cnn", 30, 0.05, 32), ("resnet18", 6, 0.01, 16)])
def test_each_model_trains_with_a_coded_scheme(tmp_path, digits_h5, model, steps, lr, batch):
    out = tmp_path / "run"
    proc = run_train(4, ["--dataset", str(digits_h5), "--model", model, "--scheme", "pgc-cr", "-s", "1",
                         "--steps", str(steps), "--lr", str(lr), "--batch-size", str(batch),
                         "--eval-every", str(steps // 3), "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evals = events_of(out, "eval")
    assert len(evals) == 3
    assert evals[-1]["train_loss"] < evals[0]["train_loss"], evals


def test_fashion_mnist_logistic_regression_learns(tmp_path):
    require_fashion_mnist()
    data = tmp_path / "fashion-mnist.h5"
    assert prep(["fashion-mnist", "--out", str(data)]) == 0
    out = tmp_path / "run"
    proc = run_train(5, ["--dataset", str(data), "--model", "logreg", "--scheme", "pgc-cr", "-s", "1",
                         "--steps", "150", "--batch-size", "64", "--lr", "0.05", "--eval-every", "50",
                         "--no-eval-train", "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = events_of(out, "summary")[0]
    assert final["final_test_accuracy"] > 0.75, final  # chance is 0.10; a broken pipeline stays near it
