"""What a torch problem is made of: a model, a data source, a loss and evaluation metrics,
from Python objects (pgc_mpi.fit, pgc_mpi.simulate) or from names (pgc-train, pgc-sim, pgc-bench:
a built-in name, an HDF5 file, or PATH:NAME, pgc_mpi.learning.plugins).

Everything a user gives is checked here for its kind and signature, with one ConfigError that
names the option and what to change; what can only be checked on data (the model's output
against the targets, a loss that sums instead of averaging) TorchProblem checks on its first
samples (pgc_mpi.learning.torch_problem).

- model: a built-in name (pgc_mpi.choices.MODELS), a torch.nn.Module, or a zero-argument factory
  (a function or an nn.Module class) that returns one. A factory is preferred: every rank calls
  it after seeding torch with --seed; only rank 0's initial weights matter (the master sends
  its parameters to the workers every step).
- loss: None (cross-entropy for integer labels, half the mean squared error for floating-point
  targets), or a callable `loss(output, target) -> scalar tensor`, the MEAN over the minibatch
  (an nn.Module loss class is instantiated with no arguments).
- metrics: None, a callable, a list of callables (named by __name__) or a dict name -> callable,
  each `metric(output, target) -> float` over a whole split.
- data: a built-in name or an HDF5 file, or `(x, y)` arrays / map-style Datasets (pgc_mpi.learning.user_data).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.utils.data import Dataset

from ..choices import MODELS
from ..errors import ConfigError
from .datasets import open_dataset
from .plugins import is_spec, label_of, load_object
from .user_data import source_of

ModelLike = str | nn.Module | Callable[[], nn.Module]
Metric = Callable[[Any, Any], float]


@dataclass
class ProblemParts:
    """A torch problem's parts, checked (see the module docstring); `*_label`: how config.json names them."""

    model: ModelLike
    source: Any
    loss: Callable | None = None
    metrics: dict[str, Metric] = field(default_factory=dict)
    model_label: str = ""
    loss_label: str | None = None


def _zero_arguments(obj: Callable, what: str) -> None:
    try:
        inspect.signature(obj).bind()
    except TypeError:
        raise ConfigError(f"{what} takes arguments {inspect.signature(obj)}: give a zero-argument function (or "
                          f"an nn.Module class whose constructor needs none) that returns the model") from None
    except ValueError:  # no signature to inspect (a builtin): calling it will tell
        pass


def model_of(obj: object, option: str = "model") -> tuple[ModelLike, str]:
    """The model as given (a built-in name, PATH:NAME, a module or a factory), checked, with its label."""
    if isinstance(obj, str):
        if obj in MODELS:
            return obj, obj
        if not is_spec(obj):
            raise ConfigError(f"--{option} {obj!r} is neither a built-in model ({', '.join(MODELS)}) nor PATH:NAME "
                              f"(a module or .py file, a colon, and a model factory or nn.Module class in it)")
        found, label, option = load_object(obj, f"--{option}"), obj, f"--{option}"
    else:
        found, label = obj, label_of(obj)
    if isinstance(found, nn.Module):
        return found, label
    if not callable(found):
        raise ConfigError(f"{option} {label} is a {type(found).__name__}, neither a torch.nn.Module nor a "
                          f"zero-argument factory of one")
    _zero_arguments(found, f"{option} {label}")
    return found, label


def loss_of(obj: object, option: str = "loss") -> tuple[Callable | None, str | None]:
    """The loss as given (None, PATH:NAME or a callable), checked for two arguments, with its label."""
    if obj is None:
        return None, None
    found, label = (load_object(obj, f"--{option}"), obj) if isinstance(obj, str) else (obj, label_of(obj))
    if isinstance(found, type) and issubclass(found, nn.Module):
        try:  # torch.nn:CrossEntropyLoss names the class: its instance is the loss
            found = found()
        except TypeError:
            raise ConfigError(f"{option} {label} is a class whose constructor needs arguments: give an instance "
                              f"or a function loss(output, target)") from None
    _two_arguments(found, f"{option} {label}", "loss(output, target) -> scalar tensor, the mean over the minibatch")
    return found, label


def metrics_of(obj: object) -> dict[str, Metric]:
    """Evaluation metrics by name: from None, one callable, a list of them or a dict."""
    if obj is None:
        return {}
    if callable(obj):
        obj = [obj]
    if isinstance(obj, Mapping):
        named = dict(obj)
    elif isinstance(obj, (list, tuple)):
        named = {getattr(m, "__name__", type(m).__name__): m for m in obj}
    else:
        raise ConfigError(f"metrics must be a callable, a list of them or a dict name -> callable, got "
                          f"{type(obj).__name__}")
    for name, metric in named.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"metric name {name!r} must be an identifier (it becomes train_{name}, test_{name}): "
                              f"name it, e.g. give metrics as a dict name -> callable")
        _two_arguments(metric, f"metric {name}", "metric(output, target) -> float")
    return named


def _two_arguments(obj: object, what: str, want: str) -> None:
    if not callable(obj):
        raise ConfigError(f"{what} is a {type(obj).__name__}, not a callable {want}")
    try:
        inspect.signature(obj).bind(None, None)
    except TypeError:
        raise ConfigError(f"{what} has the signature {inspect.signature(obj)}: it must be {want}") from None
    except ValueError:  # no signature to inspect
        pass


def source_from_spec(spec: str, seed: int, verify: bool) -> Any:
    """--dataset: a built-in name, an HDF5 file, or PATH:NAME naming data (see dataset_parts)."""
    from pathlib import Path

    if is_spec(spec) and not spec.endswith((".h5", ".hdf5")) and not Path(spec).exists():
        found = load_object(spec, "--dataset")
        return source_of(*dataset_parts(found, f"--dataset {spec}"), name=spec.rpartition(":")[2])
    return open_dataset(spec, seed, verify_checksum=verify)


def dataset_parts(found: object, what: str) -> tuple[Any, Any, Callable | None]:
    """(train, test, collate_fn) of what a --dataset PATH:NAME names: a zero-argument function is
    called first; then a Dataset or an (x, y) pair (train only), a (train, test) pair of those,
    or a dict with `train` and optionally `test` and `collate_fn`."""
    if callable(found) and not isinstance(found, Dataset):
        _zero_arguments(found, what)
        try:
            found = found()
        except Exception as exc:  # noqa: BLE001 - the user's function
            text = str(exc).strip().splitlines()
            raise ConfigError(f"{what} failed: {type(exc).__name__}: {text[0] if text else ''}") from None
    if isinstance(found, Mapping):
        unknown = set(found) - {"train", "test", "collate_fn"}
        if "train" not in found or unknown:
            raise ConfigError(f"{what} gave a dict with keys {sorted(found)}: it needs 'train' and may have "
                              f"'test' and 'collate_fn'")
        return found["train"], found.get("test"), found.get("collate_fn")
    if isinstance(found, (tuple, list)) and len(found) == 2 and all(
            part is None or isinstance(part, (tuple, list, Dataset)) for part in found):
        return found[0], found[1], getattr(found[0], "collate_fn", None)
    return found, None, getattr(found, "collate_fn", None)


def parts_of(model: object, read_source: Callable[[], Any], loss: object = None, metrics: object = None
             ) -> ProblemParts:
    """The parts, each checked: the model, then the loss, then the data `read_source()` gives, then
    the metrics (the first bad one is the error). What every way of naming them comes down to."""
    module, model_label = model_of(model)
    loss_fn, loss_label = loss_of(loss)
    return ProblemParts(module, read_source(), loss_fn, metrics_of(metrics), model_label, loss_label)


def parts_from_names(model: ModelLike, dataset: str, loss: str | None, seed: int, verify: bool) -> ProblemParts:
    """pgc-train's, pgc-sim's and pgc-bench's parts: --model, --dataset and --loss."""
    return parts_of(model, lambda: source_from_spec(dataset, seed, verify), loss)


def parts_from_objects(model: object, train_data: object, test_data: object = None, loss: object = None,
                       metrics: object = None, collate_fn: Callable | None = None) -> ProblemParts:
    """pgc_mpi.simulate's parts, from the objects given."""
    return parts_of(model, lambda: source_of(train_data, test_data, collate_fn), loss, metrics)
