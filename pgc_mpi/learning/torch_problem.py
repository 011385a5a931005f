"""The training problem of a torch model: its parameters on one flat buffer, its minibatches, losses and gradients.

FlatParams rebinds every parameter of an nn.Module (and its .grad) to views of one contiguous
buffer, so the parameters a worker receives over MPI and the gradient it sends are plain NumPy
views: no per-step flattening. Any nn.Module works (pass it instead of a model name). On a GPU
(`device`) the flat buffers live on the device and the NumPy views are of page-locked host
mirrors: one copy in (the parameters) and one copy out (the gradient) per computation.

Batch-norm and other buffers: only parameters travel. Workers run in training mode, so batch
norm normalizes with each minibatch's own statistics and the running statistics a worker
accumulates stay local (never sent). Before every evaluation the master recomputes the running
statistics from up to CALIBRATION_SAMPLES training samples at its current parameters (a
cumulative average over batches, as torch.optim.swa_utils.update_bn does), then evaluates in
eval mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from ..choices import DTYPE_NAMES
from ..core.sampling import draw_seed, needs_labels, partition_indices, refuse_unlabelled
from ..errors import ConfigError
from . import state
from .architectures import build_model
from .minibatches import Minibatches
from .parts import ModelLike, ProblemParts, parts_from_names

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # the torch dtype of each name config accepts
CALIBRATION_SAMPLES = 4096
FP16_LOSS_SCALE = 2.0 ** 16  # --autocast fp16: the loss scale every gradient starts from (torch's GradScaler's)
EVAL_BATCH = 1024


def make_module(model: ModelLike, sample_shape: tuple[int, ...], outputs: int, label: str = "") -> nn.Module:
    """The model of a problem: built by name, the module given, or what a zero-argument factory
    returns (called now: the caller seeds torch first)."""
    if isinstance(model, str):
        return build_model(model, sample_shape, outputs)
    if isinstance(model, nn.Module):
        return model
    label = label or getattr(model, "__qualname__", "the model factory")
    try:
        module = model()
    except Exception as exc:  # noqa: BLE001 - the user's factory
        text = str(exc).strip().splitlines()
        raise ConfigError(f"model factory {label} failed: {type(exc).__name__}: {text[0] if text else ''}") from None
    if not isinstance(module, nn.Module):
        raise ConfigError(f"model factory {label} returned {type(module).__name__}, not a torch.nn.Module: "
                          f"return the model")
    return module


class FlatParams:
    """A module's parameters and gradients as views into one contiguous buffer each."""

    def __init__(self, module: nn.Module, dtype: torch.dtype, device: torch.device | None = None,
                 staged: bool | None = None, pinned: bool | None = None):
        """`staged`: NumPy views of host mirrors instead of the buffers themselves (None: on a GPU
        only; True on a CPU runs the GPU's code path, for tests). `pinned`: the mirrors page-locked
        (None: on a CUDA device, which page-locked memory needs; False there only to measure what
        pinning saves, benchmarks/gpu_check.py)."""
        device = torch.device("cpu") if device is None else device
        staged = device.type != "cpu" if staged is None else staged
        pinned = device.type == "cuda" if pinned is None else pinned
        module.to(dtype)
        for buffer in module.buffers():  # batch-norm statistics go with the parameters (not travelling)
            buffer.data = buffer.data.to(device)
        params = list(module.parameters())
        self.dim = sum(p.numel() for p in params)
        self.flat = torch.empty(self.dim, dtype=dtype, device=device)
        self.flat_grad = torch.zeros(self.dim, dtype=dtype, device=device)
        offset = 0
        for p in params:
            size = p.numel()
            self.flat[offset:offset + size].copy_(p.data.reshape(-1))
            p.data = self.flat[offset:offset + size].view_as(p)
            p.grad = self.flat_grad[offset:offset + size].view_as(p)
            offset += size
        self._params = params
        # on a GPU: host mirrors, page-locked so that the copies to and from the device are direct
        self._host = torch.empty(self.dim, dtype=dtype, pin_memory=pinned) if staged else None
        self._host_grad = torch.zeros(self.dim, dtype=dtype, pin_memory=pinned) if staged else None
        if self._host is not None:
            self._host.copy_(self.flat)
        self.values: np.ndarray = (self.flat if self._host is None else self._host).numpy()
        self.grads: np.ndarray = (self.flat_grad if self._host_grad is None else self._host_grad).numpy()

    def push(self) -> None:
        """Make the module's parameters `values` (on a GPU: copy the host mirror to the device)."""
        if self._host is not None:
            self.flat.copy_(self._host)

    def pull_grads(self) -> None:
        """Make `grads` the module's gradient (on a GPU: copy it to the host mirror, synchronously)."""
        if self._host_grad is not None:
            self._host_grad.copy_(self.flat_grad)

    def check_views(self) -> None:
        """Fail loudly if autograd replaced a .grad instead of accumulating into our buffer."""
        base = self.flat_grad.data_ptr()
        end = base + self.dim * self.flat_grad.element_size()
        if any(p.grad is None or not base <= p.grad.data_ptr() < end for p in self._params):
            raise RuntimeError("a parameter's .grad no longer views the flat gradient buffer")


class TorchProblem:
    """A torch model trained on a data source: the Problem protocol of problems.py.

    `model`: a built-in name, an nn.Module or a zero-argument factory (pgc_mpi.learning.parts); `loss`: a
    callable loss(output, target), the mean over the minibatch (None: cross-entropy for integer
    labels, half the mean squared error for floating-point targets); `metrics`: name -> callable
    metric(output, target) over a whole split, reported in evaluate() as train_<name>, test_<name>.

    Only the partitions in `partitions` (all when None) are read from the source: at once from
    arrays and HDF5 files, a minibatch at a time from a lazy source (a torch Dataset). The test
    split and the training split used for evaluation are read on first evaluate(). A source with
    no test split is evaluated on its training split only.
    """

    optimum = None
    # --autocast (set by problem_of): none, bf16 or fp16. With fp16 every gradient is computed with
    # the loss scaled by FP16_LOSS_SCALE, halved and recomputed while the gradient overflows: the
    # scale starts afresh for every gradient, so that the holders of a partition, which compute the
    # same thing, find the same scale and send the same bits (decoding stays exact).
    autocast = "none"

    def __init__(self, model: ModelLike, source: Any, n: int, batch_size: int | None,
                 seed: int = 0, dtype: str = "float32", partitions: Iterable[int] | None = None,
                 eval_train: bool = True, device: torch.device | None = None, staged: bool | None = None,
                 pinned: bool | None = None, loss: Callable | None = None,
                 metrics: Mapping[str, Callable] | None = None, model_label: str = "",
                 partitioning: str = "iid"):
        if dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if source.info.num_test == 0 and not eval_train:
            raise ConfigError("--no-eval-train evaluates on the test split only, and this data has none: give "
                              "test data, or leave evaluations on the training data")
        if isinstance(model, str) and source.info.task == "classification" and source.info.num_classes == 0:
            source.count_classes()  # a Dataset without `classes`: a built-in model needs their number
        info = source.info
        self.info, self.source, self.dtype = info, source, DTYPES[dtype]
        self.device = torch.device("cpu") if device is None else device
        self.regression = info.task == "regression"
        self.user_loss, self.metric_fns = loss, dict(metrics or {})
        torch.manual_seed(seed)
        outputs = 1 if self.regression else info.num_classes
        self.module = make_module(model, info.sample_shape, outputs, model_label)
        self.flat = FlatParams(self.module, self.dtype, self.device, staged, pinned)
        self.has_buffers = any(True for _ in self.module.buffers())
        self.dim = self.flat.dim
        # the parameters' shapes in order: every rank must build the same (pgc_mpi.job.checks.same_model checks)
        self.param_shapes = [tuple(p.shape) for p in self.module.parameters()]
        self.batch_size, self.seed, self.eval_train = batch_size, seed, eval_train or info.num_test == 0
        self.partitioning = partitioning
        self.partitions = partition_indices(info.num_train, n, seed, partitioning, _labels(source, partitioning))
        self.stored = range(n) if partitions is None else sorted(set(partitions))
        self.minibatches = Minibatches(source, self.partitions, self.stored, batch_size, seed, self._tensors)
        self._eval: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._initial = self.flat.values.copy()
        self._check_fit()

    def _tensors(self, x: Any, y: Any, pinned: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Features in the model's dtype (integer ones, such as token ids, stay int64) and targets:
        int64 labels, or floating-point targets in the model's dtype, on the device. `pinned`: a
        prefetched minibatch on its way to a CUDA device goes through page-locked memory."""
        x, y = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x), torch.as_tensor(
            np.asarray(y) if not isinstance(y, torch.Tensor) else y)
        integer_x = not x.is_floating_point() and x.dtype not in (torch.uint8, torch.bool)
        x, y = x.to(dtype=torch.int64 if integer_x else self.dtype), y.to(
            dtype=torch.int64 if not self.regression else self.dtype)
        if pinned and self.device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(self.device, non_blocking=pinned), y.to(self.device, non_blocking=pinned)

    def _check_fit(self) -> None:
        """A forward pass and the loss on two training samples: a model that does not fit the data,
        a loss that fails on its output or sums instead of averaging, fails here with one line."""
        x, y = self._tensors(*self.source.read_train(np.arange(min(2, self.info.num_train))))
        try:
            with torch.no_grad():
                self.module.eval()
                out = self.module(x)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise ConfigError(f"the model does not fit samples of shape {list(self.info.sample_shape)}: "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        finally:
            self.module.train()
        if not isinstance(out, torch.Tensor):
            raise ConfigError(f"the model returns {type(out).__name__}, not a tensor: return the output tensor")
        if self.user_loss is None:
            self._check_default_loss(out)
            return
        with torch.no_grad():
            once = self._loss_value(out, y)
            twice = self._loss_value(torch.cat([out, out]), torch.cat([y, y]))
        if abs(once) > 1e-12 and abs(twice / once - 2) < 1e-3:
            raise ConfigError(f"the loss sums over the minibatch (twice the samples gave twice the loss, {once:.4g} -> "
                              f"{twice:.4g}); return the mean (reduction='mean'): decoding weights every partition's "
                              f"mean gradient")

    def _check_default_loss(self, out: torch.Tensor) -> None:
        if self.regression and out.numel() != out.shape[0]:
            raise ConfigError(f"the model's output has shape {list(out.shape[1:])} per sample; the default regression "
                              f"loss needs one value per sample: give a loss for this output")
        if not self.regression and (out.ndim != 2 or out.shape[1] < self.info.num_classes):
            raise ConfigError(f"the model's output has shape {list(out.shape[1:])} per sample, but the data has "
                              f"{self.info.num_classes} classes: the default cross-entropy loss needs "
                              f"[{self.info.num_classes}] logits per sample (or give a loss for this output)")

    def _loss_value(self, out: torch.Tensor, y: torch.Tensor) -> float:
        """The user's loss on (out, y) as a float, its failures as one-line ConfigErrors."""
        try:
            value = self.user_loss(out, y)
        except Exception as exc:  # noqa: BLE001 - the user's loss
            text = str(exc).strip().splitlines()
            raise ConfigError(f"the loss fails on the model's output of shape {list(out.shape)} and targets of shape "
                              f"{list(y.shape)}: {type(exc).__name__}: {text[0] if text else ''}") from None
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ConfigError(f"the loss must return a scalar tensor (the mean over the minibatch), got {shape}")
        return float(value)

    def initial_params(self) -> np.ndarray:
        """The seeded initial parameters (a copy)."""
        return self._initial.copy()

    def _loss(self, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if self.user_loss is not None:  # a mean over the batch (checked): the sum is it times the batch
            mean = self.user_loss(out, y)
            return mean if reduction == "mean" else mean * len(y)
        if self.regression:  # (1/2) squared error, as problems.LeastSquares
            return 0.5 * nn.functional.mse_loss(out.squeeze(1), y, reduction=reduction)
        return nn.functional.cross_entropy(out, y, reduction=reduction)

    def loss_and_grad(self, w: np.ndarray, partition: int, draw: int) -> tuple[float, np.ndarray]:
        """Mean loss of the partition's `draw`-th minibatch at w, and its gradient (a copy)."""
        self._load(w)
        self.module.train()
        scale = FP16_LOSS_SCALE if self.autocast == "fp16" else None
        while True:
            self.flat.flat_grad.zero_()
            loss = self.minibatch_loss(partition, draw)
            (loss if scale is None else loss * scale).backward()
            if scale is None or scale <= 1 or torch.isfinite(self.flat.flat_grad).all():
                break
            scale /= 2  # float16 overflowed: the same computation again with half the scale
        if scale is not None:
            self.flat.flat_grad.mul_(1 / scale)
        self.flat.check_views()
        self.flat.pull_grads()
        return float(loss.detach()), self.flat.grads.copy()

    def minibatch_loss(self, partition: int, draw: int, module: nn.Module | None = None) -> torch.Tensor:
        """The mean loss of the partition's `draw`-th minibatch at the current parameters, ready for
        backward(). The forward pass goes through `module`: this problem's model (None) or a wrapper
        of it, such as the DistributedDataParallel of the ddp baseline (pgc_mpi.runtime.ddp). torch's
        generator is seeded from (seed, partition, draw) first: random transforms and dropout draw
        the same on every holder of the partition."""
        if partition not in self.stored:
            raise KeyError(f"partition {partition} is not stored here (stored: {list(self.stored)})")
        torch.manual_seed(draw_seed(self.seed, partition, draw))
        x, y = self.minibatches.get(partition, draw)  # a prefetched one restores the generator's state after its load
        with self._autocast():
            return self._loss((self.module if module is None else module)(x), y)

    def _autocast(self):
        """The forward pass's precision (--autocast): torch.autocast on this problem's device, or none.
        The backward runs outside it, in the dtypes autocast chose; the parameters and their
        gradients stay in --dtype."""
        if self.autocast == "none":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16 if self.autocast == "bf16" else torch.float16)

    def expect(self, draws: Iterable[tuple[int, int]]) -> None:
        """The (partition, draw) minibatches computed next, in order: loaded ahead where
        `minibatches` has loaders (pgc_mpi.learning.minibatches, which also counts the data wait)."""
        self.minibatches.expect(draws)

    def grad(self, w: np.ndarray, partition: int, draw: int) -> np.ndarray:
        """The gradient of loss_and_grad."""
        return self.loss_and_grad(w, partition, draw)[1]

    def probe_grad(self, w: np.ndarray) -> np.ndarray:
        """The mean-loss gradient at w on a fixed minibatch of the test split (the first
        --batch-size samples; of the training split where there is no test split): the
        validation minibatch pbs's diagnostics compare models on."""
        x, y = self._split("test" if self.info.num_test else "train")
        rows = slice(0, self.batch_size or len(y))
        self._load(w)
        self.module.train()
        self.flat.flat_grad.zero_()
        self._loss(self.module(x[rows]), y[rows]).backward()
        self.flat.pull_grads()
        return self.flat.grads.copy()

    def _split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        if split not in self._eval:
            self._eval[split] = self._tensors(*self.source.read_split(split))
        return self._eval[split]

    @torch.no_grad()
    def _recalibrate(self) -> None:
        """Recompute batch-norm running statistics at the current parameters (see the module doc)."""
        x, _ = self._split("train") if self.eval_train else self._calibration_set()
        for m in self.module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.reset_running_stats()
                m.momentum = None  # cumulative average over the calibration batches
        self.module.train()
        for start in range(0, min(len(x), CALIBRATION_SAMPLES), EVAL_BATCH):
            self.module(x[start:min(start + EVAL_BATCH, CALIBRATION_SAMPLES)])

    def _calibration_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        if "calibration" not in self._eval:
            rows = np.sort(np.random.default_rng([self.seed, 0xCA1]).permutation(self.info.num_train)
                           [:CALIBRATION_SAMPLES])
            self._eval["calibration"] = self._tensors(*self.source.read_train(rows))
        return self._eval["calibration"]

    @torch.no_grad()
    def _metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """Mean loss, accuracy (classification) and the user's metrics over every sample, the last
        incomplete batch included."""
        self.module.eval()
        total, correct, logits, outputs = 0.0, 0, not self.regression, []
        for start in range(0, len(y), EVAL_BATCH):
            out = self.module(x[start:start + EVAL_BATCH])
            yb = y[start:start + EVAL_BATCH]
            total += float(self._loss(out, yb, reduction="sum"))
            logits = logits and out.ndim == 2  # accuracy: of classification models that output logits
            if logits:
                correct += int((out.argmax(dim=1) == yb).sum())
            if self.metric_fns:
                outputs.append(out)
        self.module.train()
        found = {"loss": total / max(len(y), 1)}
        if logits:
            found["accuracy"] = correct / max(len(y), 1)
        if outputs:
            found.update(self._user_metrics(torch.cat(outputs), y))
        return found

    def _user_metrics(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        found = {}
        for name, metric in self.metric_fns.items():
            value = metric(out, y)
            found[name] = float(value.item() if isinstance(value, torch.Tensor) else value)
        return found

    def loss(self, w: np.ndarray) -> float:
        """Mean training loss over every training sample."""
        self._load(w)
        if self.has_buffers:
            self._recalibrate()
        return self._metrics(*self._split("train"))["loss"]

    def evaluate(self, w: np.ndarray) -> dict[str, float]:
        """Test loss and accuracy (and training loss and accuracy with eval_train), and the
        user's metrics, over every sample."""
        self._load(w)
        if self.has_buffers:
            self._recalibrate()
        out = {}
        splits = (("train",) if self.eval_train else ()) + (("test",) if self.info.num_test else ())
        for split in splits:
            for name, value in self._metrics(*self._split(split)).items():
                out[f"{split}_{name}"] = value
        return out

    def set_params(self, w: np.ndarray) -> None:
        """Make `w` (a flat parameter vector) the model's parameters."""
        self._load(w)

    def state_layout(self) -> list[dict[str, Any]]:
        """The module's state_dict entries in order: name, kind, shape, dtype, offset (learning.state)."""
        return state.layout_of(self.module)

    def model_state(self, w: np.ndarray) -> dict[str, np.ndarray]:
        """The module's buffers at parameters `w` as evaluate() recalibrates them (learning.state.model_state)."""
        return state.model_state(self, w)

    def state_dict(self, w: np.ndarray) -> dict[str, torch.Tensor]:
        """The module's whole state_dict at `w` on the CPU: parameters from `w`, buffers from model_state(w)."""
        return state.assemble_state_dict(self.state_layout(), np.asarray(w), self.model_state(w))

    def _load(self, w: np.ndarray) -> None:
        if w is not self.flat.values:
            np.copyto(self.flat.values, w, casting="same_kind")
        self.flat.push()


def _labels(source: Any, partitioning: str) -> np.ndarray | None:
    """The training labels a partitioning by class cuts by (None for iid: it needs none); the one
    error of --partitioning on data without class labels (a regression set)."""
    if not needs_labels(partitioning):
        return None
    info = source.info
    if info.task != "classification":
        refuse_unlabelled(partitioning, f"data set {info.name!r} ({info.task})")
    return source.train_labels()


def problem_of(parts: ProblemParts, n: int, batch_size: int | None, *, seed: int = 0, dtype: str = "float32",
               partitions: Iterable[int] | None = None, eval_train: bool = True,
               device: torch.device | None = None, autocast: str = "none", partitioning: str = "iid") -> TorchProblem:
    """The torch problem of `parts` cut into n partitions (of which `partitions`, None: all, are
    read) as `partitioning` says (pgc_mpi.core.sampling), seeded, on `device` (None: the CPU), its
    gradients computed under `autocast` (none, bf16, fp16): what every command and pgc_mpi.fit build."""
    if parts.source.info.num_train < n:
        raise ConfigError(f"data set {parts.source.info.name!r} has {parts.source.info.num_train} training samples, "
                          f"fewer than the {n} partitions (one per worker): use fewer workers or a larger data set")
    problem = TorchProblem(parts.model, parts.source, n, batch_size, seed=seed, dtype=dtype, partitions=partitions,
                           eval_train=eval_train, device=device, loss=parts.loss, metrics=parts.metrics,
                           model_label=parts.model_label, partitioning=partitioning)
    problem.autocast = autocast
    return problem


def torch_problem(model: ModelLike, train_data: Any, *, workers: int, loss: Callable | None = None,
                  test_data: Any = None, metrics: Any = None, collate_fn: Callable | None = None,
                  batch_size: int | None = 32, seed: int = 0, dtype: str = "float32",
                  eval_train: bool = True, partitioning: str = "iid") -> TorchProblem:
    """Your model, loss and data as the problem the simulator computes (pgc_mpi.simulate): the
    arguments mean what they mean in pgc_mpi.fit; the data is cut into `workers` partitions."""
    from .parts import parts_from_objects

    parts = parts_from_objects(model, train_data, test_data, loss, metrics, collate_fn)
    return problem_of(parts, workers, batch_size, seed=seed, dtype=dtype, eval_train=eval_train,
                      partitioning=partitioning)


def load_problem(dataset: str, model: ModelLike, n: int, batch_size: int | None, *, seed: int = 0,
                 dtype: str = "float32", partitions: Iterable[int] | None = None, eval_train: bool = True,
                 verify: bool = True, device: torch.device | None = None, loss: str | None = None,
                 partitioning: str = "iid") -> TorchProblem:
    """The problem pgc-train's ranks and pgc-sim build from --dataset, --model, --loss, --batch-size,
    --dtype and --seed: `dataset` (a built-in name, an HDF5 file whose checksum is checked with
    `verify`, or PATH:NAME) cut into n partitions, of which `partitions` (None: all) are read, and
    the seeded `model` (a built-in name or PATH:NAME), computed on `device` (None: the CPU)."""
    parts = parts_from_names(model, dataset, loss, seed, verify)
    return problem_of(parts, n, batch_size, seed=seed, dtype=dtype, partitions=partitions, eval_train=eval_train,
                      device=device, partitioning=partitioning)
