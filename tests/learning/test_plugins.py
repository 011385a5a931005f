"""Your own model, loss, metrics and data: plug-in specs, their checks, and the problem built of them."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import pgc_mpi
from pgc_mpi.config import SimConfig, TrainConfig, config_from_options, options_from_args
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.parts import dataset_parts, loss_of, metrics_of, model_of, parts_from_names
from pgc_mpi.learning.plugins import is_spec, load_object
from pgc_mpi.learning.torch_problem import torch_problem

ROOT = Path(__file__).resolve().parents[2]
NETS = ROOT / "examples" / "nets.py"


def small_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


def arrays(n: int = 200, seed: int = 0, regression: bool = False):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 1, 8, 8)).astype(np.float32)
    y = rng.normal(size=n).astype(np.float32) if regression else rng.integers(0, 10, n)
    return x, y


def test_specs_name_a_module_or_a_file():
    assert is_spec("mypkg.nets:make") and is_spec("./nets.py:make") and not is_spec("logreg")
    assert not is_spec(":make") and not is_spec("nets.py:")
    assert load_object(f"{NETS}:make_model", "--model").__name__ == "make_model"
    assert load_object("torch.nn:Linear", "--model") is nn.Linear


@pytest.mark.parametrize("spec,message", [
    ("./missing.py:make", "no such file ./missing.py"),
    ("missing_pkg_xyz.nets:make", "no module named 'missing_pkg_xyz'"),
    (f"{NETS}:nope", "has no attribute 'nope' (it defines: digits, focal_loss, load_digits, make_model"),
    ("logreg", "is not PATH:NAME"),
])
def test_a_bad_spec_is_one_line_naming_what_to_change(spec, message):
    with pytest.raises(ConfigError) as exc:
        load_object(spec, "--model")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_file_that_fails_to_import_says_so(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("import torch\nraise RuntimeError('no GPU here')\n")
    with pytest.raises(ConfigError, match="importing .*broken.py failed: RuntimeError: no GPU here"):
        load_object(f"{bad}:make", "--model")


def test_models_losses_and_metrics_are_checked_for_their_signature():
    assert model_of("mlp") == ("mlp", "mlp")
    assert model_of(small_model)[0] is small_model
    assert isinstance(model_of(small_model())[0], nn.Module)
    with pytest.raises(ConfigError, match=r"takes arguments \(width\).*zero-argument"):
        model_of(lambda width: small_model())
    with pytest.raises(ConfigError, match="neither a torch.nn.Module nor a zero-argument factory"):
        model_of(42)
    with pytest.raises(ConfigError, match="neither a built-in model"):
        model_of("gpt")
    loss, label = loss_of("torch.nn:CrossEntropyLoss")  # a loss class is instantiated
    assert isinstance(loss, nn.CrossEntropyLoss) and label == "torch.nn:CrossEntropyLoss"
    with pytest.raises(ConfigError, match=r"loss\(output, target\)"):
        loss_of(lambda output: output.sum())
    assert set(metrics_of({"mae": lambda o, t: 0.0})) == {"mae"}
    with pytest.raises(ConfigError, match="must be an identifier"):
        metrics_of({"top 5": lambda o, t: 0.0})


def test_a_summed_loss_is_refused_before_training():
    """A loss with reduction='sum' passed by mistake would train at batch-size times the scale."""
    summed = lambda out, y: nn.functional.cross_entropy(out, y, reduction="sum")  # noqa: E731
    with pytest.raises(ConfigError, match="the loss sums over the minibatch"):
        torch_problem(small_model, arrays(), workers=4, loss=summed)
    mean = lambda out, y: nn.functional.cross_entropy(out, y)  # noqa: E731
    assert torch_problem(small_model, arrays(), workers=4, loss=mean).dim == 650


@pytest.mark.parametrize("model,loss,message", [
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), None, "has shape [3] per sample, but the data has 10"),
    (lambda: nn.Linear(5, 10), None, "the model does not fit samples of shape [1, 8, 8]"),
    (small_model, lambda out, y: nn.functional.mse_loss(out, y), "the loss fails on the model's output of shape"),
    (small_model, lambda out, y: (out.argmax(1) == y).float(), "must return a scalar tensor"),
    (lambda: "not a module", None, "returned str, not a torch.nn.Module"),
])
def test_a_model_or_loss_that_does_not_fit_the_data_is_one_line(model, loss, message):
    with pytest.raises(ConfigError) as exc:
        torch_problem(model, arrays(), workers=4, loss=loss)
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("data,message", [
    ((np.zeros((5, 3)), np.zeros(4, int)), "one row per sample"),
    ((np.full((5, 3), np.nan), np.zeros(5, int)), "NaN or infinite"),
    ((np.zeros((5, 3)), -np.ones(5, int)), "negative labels"),
    ((np.zeros((0, 3)), np.zeros(0, int)), "has no samples"),
    ([1, 2, 3], "must be a pair (x, y) of arrays or a torch Dataset"),
])
def test_bad_arrays_are_one_line(data, message):
    with pytest.raises(ConfigError) as exc:
        torch_problem(small_model, data, workers=2)
    assert message in str(exc.value)


def test_metrics_are_evaluated_by_name_and_no_test_data_means_training_data_only():
    x, y = arrays(regression=True)
    model = lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 1))  # noqa: E731
    mae = lambda out, t: float((out.squeeze(1) - t).abs().mean())  # noqa: E731
    problem = torch_problem(model, (x, y), workers=4, metrics={"mae": mae})
    found = problem.evaluate(problem.initial_params())
    assert set(found) == {"train_loss", "train_mae"}  # regression: no accuracy; no test split
    split = torch_problem(model, (x[:150], y[:150]), test_data=(x[150:], y[150:]), workers=4, metrics={"mae": mae})
    assert set(split.evaluate(split.initial_params())) == {"train_loss", "train_mae", "test_loss", "test_mae"}
    with pytest.raises(ConfigError, match="metric name '<lambda>' must be an identifier.*as a dict"):
        metrics_of([mae])  # a lambda has no name to report it by
    with pytest.raises(ConfigError, match="--no-eval-train evaluates on the test split only, and this data has none"):
        torch_problem(model, (x, y), workers=4, eval_train=False)


class CountingDigits(Dataset):
    """Random 8x8 images whose reads are counted, with a random shift drawn from torch's generator."""

    def __init__(self, n: int = 120):
        self.x, self.y = arrays(n)
        self.read: list[int] = []
        self.classes = list(range(10))

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        self.read.append(i)
        shift = int(torch.randint(-1, 2, ()))
        return torch.roll(torch.from_numpy(self.x[i]), shift, dims=2), int(self.y[i])


def test_a_dataset_is_read_a_minibatch_at_a_time_and_only_its_own_partitions():
    data = CountingDigits()
    problem = pgc_mpi.TorchProblem(small_model, _source(data), 4, 8, seed=1, partitions=[2])
    data.read.clear()
    problem.grad(problem.initial_params(), 2, draw=5)
    assert len(data.read) == 8 and set(data.read) <= set(problem.partitions[2].tolist())
    with pytest.raises(KeyError):
        problem.grad(problem.initial_params(), 1, draw=0)


def test_two_holders_of_a_partition_draw_the_same_transform_and_dropout():
    """Gradient coding decodes exactly only when every holder of a partition computes the same
    gradient: torch's generator is seeded per (seed, partition, draw) for transforms and dropout."""
    model = lambda: nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(64, 10))  # noqa: E731
    a = pgc_mpi.TorchProblem(model, _source(CountingDigits()), 4, 8, seed=1, partitions=[0, 1])
    b = pgc_mpi.TorchProblem(model, _source(CountingDigits()), 4, 8, seed=1, partitions=[1, 2])
    w = a.initial_params()
    assert np.array_equal(a.grad(w, 1, 3), b.grad(w, 1, 3))
    assert not np.array_equal(a.grad(w, 1, 3), a.grad(w, 1, 4))  # another draw: another minibatch and shift


def _source(data: Dataset):
    from pgc_mpi.learning.user_data import source_of

    return source_of(data)


def test_dataset_plugins_give_train_and_test_in_every_documented_form():
    x, y = arrays()
    assert dataset_parts(lambda: (x, y), "d")[1] is None
    train, test, _ = dataset_parts(lambda: ((x, y), (x, y)), "d")
    assert train[0] is x and test[1] is y
    collate = lambda batch: batch  # noqa: E731
    assert dataset_parts({"train": (x, y), "collate_fn": collate}, "d")[2] is collate
    with pytest.raises(ConfigError, match="needs 'train'"):
        dataset_parts({"training": (x, y)}, "d")
    parts = parts_from_names(f"{NETS}:make_model", f"{NETS}:digits", f"{NETS}:focal_loss", seed=0, verify=True)
    assert parts.source.info.num_train == 1500 and parts.source.info.num_test == 297


def test_train_config_takes_plugin_specs_and_refuses_what_is_not_one():
    TrainConfig(model="./nets.py:make", loss="nets:focal").validate(4)
    with pytest.raises(ConfigError, match="--loss 'focal' is not PATH:NAME"):
        TrainConfig(loss="focal").validate(4)
    with pytest.raises(ConfigError, match="exclude each other"):
        TrainConfig(problem="quadratic", loss="nets:focal").validate(4)


def test_fit_options_are_pgc_trains_with_its_checks():
    cfg = config_from_options({"scheme": "gc-cr", "stragglers": 2, "lr": 1, "checkpoint_every": 5})
    assert cfg.lr == 1.0 and cfg.stragglers == 2 and cfg.checkpoint_every == 5
    with pytest.raises(ConfigError, match="unknown option 'learning_rate'"):
        config_from_options({"learning_rate": 0.1})
    with pytest.raises(ConfigError, match="option 'steps' must be of type int"):
        config_from_options({"steps": "ten"})
    with pytest.raises(ConfigError, match="--lr must be a number > 0"):
        config_from_options({"lr": -1.0}).validate(4)


def test_a_scripts_command_line_overrides_its_defaults(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mine.py", "--steps", "7", "--resume", "auto"])
    assert options_from_args(steps=300, lr=0.3) == {"steps": 7, "lr": 0.3, "resume": "auto"}
    with pytest.raises(SystemExit):
        options_from_args(["--stepz", "7"])


def test_simulate_takes_your_model_and_data_as_fit_does():
    x, y = arrays()
    cfg = SimConfig(scheme="pgc-cr", workers=4, steps=6, delay="exp:1.0", eval_every=3, seed=2)
    focal = load_object(f"{NETS}:focal_loss", "--loss")
    direct = pgc_mpi.simulate(cfg, model=small_model, train_data=(x, y), loss=focal, batch_size=16)
    built = pgc_mpi.simulate(dataclasses.replace(cfg), torch_problem(small_model, (x, y), workers=4, loss=focal,
                                                                     batch_size=16, seed=2))
    assert [e["train_loss"] for e in direct.evals] == [e["train_loss"] for e in built.evals]
    with pytest.raises(TypeError, match="one of them"):
        pgc_mpi.simulate(cfg)
