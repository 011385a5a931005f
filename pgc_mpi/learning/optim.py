"""The master's update, the run's training recipe: an optimizer (built-in or the user's), a
learning-rate schedule and gradient clipping, stepping a flat parameter vector in place.

The parameters the optimizer sees are views of the flat vector `w` and their .grad views of
one gradient buffer, which the decoder writes into: a step moves no bytes between NumPy and
torch. A built-in optimizer sees `w` as one tensor (every built-in is element-wise, so with
--servers K each server steps its shard alone); a user's factory sees a copy of the model whose
parameters are rebound to views of `w`, so that param groups (no weight decay on biases and
norms) work as in a plain torch loop.
"""

from __future__ import annotations

import copy
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..choices import LR_SCHEDULES, OPTIMIZERS
from ..errors import ConfigError

# torch.nn.utils.clip_grad_norm_'s guard against a zero norm: the same coefficient as a torch loop.
CLIP_EPS = 1e-6


@dataclass(frozen=True)
class Recipe:
    """The update's settings (a subset of the run's configuration: `Recipe.of(cfg)`)."""

    optimizer: str = "sgd"
    lr: float = 0.5
    momentum: float = 0.9
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    lr_milestones: tuple[int, ...] = ()
    lr_gamma: float = 0.1
    steps: int = 1
    clip_grad_norm: float | None = None

    @classmethod
    def of(cls, cfg: Any, **overrides: Any) -> Recipe:
        """The recipe of a configuration (TrainConfig or SimConfig), with `overrides`."""
        values = {
            "optimizer": cfg.optimizer, "lr": cfg.lr, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay,
            "betas": parse_floats(cfg.betas), "eps": cfg.eps, "lr_schedule": cfg.lr_schedule,
            "warmup_steps": cfg.warmup_steps, "min_lr": cfg.min_lr,
            "lr_milestones": tuple(int(m) for m in parse_floats(cfg.lr_milestones or "")),
            "lr_gamma": cfg.lr_gamma, "steps": cfg.steps, "clip_grad_norm": cfg.clip_grad_norm,
        }
        return cls(**{**values, **overrides})

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate changes over the run (a built-in schedule or a warm-up)."""
        return self.lr_schedule != "constant" or self.warmup_steps > 0


def make_update(cfg: Any, w: np.ndarray, problem: Any = None, objects: Any = None, **overrides: Any) -> FlatOptimizer:
    """The update a configuration asks for over `w`: its built-in optimizer and schedule, or the
    factories `objects` holds (pgc_mpi.job.recipe.RecipeObjects: what pgc_mpi.fit was given)
    or its --optimizer / --scheduler PATH:NAME name (imported here), on `problem`'s model.
    `overrides` change the recipe (Recipe.of)."""
    from .plugins import is_spec, load_object

    factory, scheduler = getattr(objects, "optimizer", None), getattr(objects, "scheduler", None)
    if factory is None and is_spec(cfg.optimizer):
        factory = load_object(cfg.optimizer, "--optimizer")
    if scheduler is None and getattr(cfg, "scheduler", None):
        scheduler = load_object(cfg.scheduler, "--scheduler")
    if factory is not None:  # the configuration's name is then the factory's label, not a built-in's
        overrides = {"optimizer": "sgd", **overrides}
    return FlatOptimizer(w, Recipe.of(cfg, **overrides), module=getattr(problem, "module", None), factory=factory,
                         scheduler=scheduler, label=cfg.optimizer if factory is not None else "")


def parse_floats(text: str | tuple | list) -> tuple[float, ...]:
    """'0.9,0.999' -> (0.9, 0.999) (the config layer has checked the text)."""
    if isinstance(text, (tuple, list)):
        return tuple(float(v) for v in text)
    return tuple(float(part) for part in str(text).split(",") if part.strip())


def schedule_factor(recipe: Recipe) -> Callable[[int], float]:
    """The built-in schedule as a factor of --lr after `t` updates (torch's LambdaLR): a linear
    warm-up from lr/W to lr over the first W = --warmup-steps updates, then constant, a cosine or
    a linear decay to --min-lr at the last step, or x --lr-gamma at each of --lr-milestones."""
    warmup, steps, floor = recipe.warmup_steps, recipe.steps, recipe.min_lr / recipe.lr
    kind, milestones, gamma = recipe.lr_schedule, recipe.lr_milestones, recipe.lr_gamma

    def factor(t: int) -> float:
        if t < warmup:
            return (t + 1) / warmup
        if kind == "constant":
            return 1.0
        if kind == "step":
            return gamma ** sum(t >= m for m in milestones)
        progress = min(1.0, (t - warmup) / max(1, steps - 1 - warmup))
        if kind == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1 - (1 - floor) * progress  # linear

    return factor


def builtin_optimizer(params: list, recipe: Recipe) -> torch.optim.Optimizer:
    """One of OPTIMIZERS over `params` (a list of tensors or of param-group dicts)."""
    name, lr, wd = recipe.optimizer, recipe.lr, recipe.weight_decay
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)} or PATH:NAME")
    if name in ("adam", "adamw"):
        kind = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return kind(params, lr=lr, betas=recipe.betas, eps=recipe.eps, weight_decay=wd)
    momentum = recipe.momentum if name in ("momentum", "nesterov") else 0.0
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd, nesterov=name == "nesterov")


class FlatOptimizer:
    """Applies g_hat to the flat parameters `w` (a NumPy array, updated in place): clipping, the
    optimizer's step, the schedule's step.

    `module`: the model whose parameters `w` holds (in module.parameters() order), needed by an
    optimizer `factory` (called once with a copy of it whose parameters view `w`). `scheduler`:
    a factory optimizer -> LRScheduler; without it the recipe's built-in schedule (if any).
    """

    def __init__(self, w: np.ndarray, recipe: Recipe | str = "sgd", lr: float | None = None,
                 momentum: float | None = None, *, module: torch.nn.Module | None = None,
                 factory: Callable | None = None, scheduler: Callable | None = None, label: str = ""):
        if isinstance(recipe, str):  # FlatOptimizer(w, "momentum", lr, momentum=...): a built-in, constant lr
            recipe = Recipe(optimizer=recipe, **{k: v for k, v in (("lr", lr), ("momentum", momentum))
                                                 if v is not None})
        if not recipe.lr > 0:
            raise ConfigError(f"the learning rate must be > 0, got {recipe.lr}")
        self.recipe, self.w = recipe, w
        self._grad = np.zeros_like(w)
        self.module: torch.nn.Module | None = None
        if factory is None:
            self.param = torch.nn.Parameter(torch.from_numpy(w), requires_grad=False)
            self.param.grad = torch.from_numpy(self._grad)
            self.opt = builtin_optimizer([self.param], recipe)
        else:
            self.module = _module_on(w, self._grad, module, label)
            self.opt = _user_optimizer(factory, self.module, label)
        self.scheduler = _scheduler(scheduler, self.opt, recipe, label)

    @property
    def flat(self) -> bool:
        """Whether the optimizer's state is per element of `w` (a built-in: one tensor), which
        --servers K can shard and a checkpoint stores as vectors."""
        return self.module is None

    @property
    def grad(self) -> np.ndarray:
        """The buffer the decoded gradient is written into before step()."""
        return self._grad

    def lrs(self) -> list[float]:
        """The learning rate of each param group, as the next step() will apply it."""
        return [float(group["lr"]) for group in self.opt.param_groups]

    def grad_norm(self) -> float:
        """The L2 norm of the decoded gradient (a BLAS dot, in its dtype)."""
        g = self._grad  # BLAS's dot in the gradient's own dtype: no float64 copy (16 ms of 18 at 11M, §21)
        return math.sqrt(float(np.dot(g, g)))

    @torch.no_grad()
    def step(self, measure: bool = True) -> dict[str, Any]:
        """w <- optimizer(w, clip(grad)), then the schedule's step. Returns the step record's part:
        "lr" (the first group's rate this step used), "lr_groups" (every group's, where they
        differ) and, with `measure` or clipping, "grad_norm" (the gradient's norm before clipping;
        a server of one shard has no use for its shard's norm: measure=False)."""
        lrs = self.lrs()
        limit = self.recipe.clip_grad_norm
        out: dict[str, Any] = {"lr": lrs[0]}
        if measure or limit is not None:
            out["grad_norm"] = norm = self.grad_norm()
            if limit is not None and limit / (norm + CLIP_EPS) < 1:
                self._grad *= limit / (norm + CLIP_EPS)
        self.opt.step()
        if self.scheduler is not None:
            self.scheduler.step()
        if len(set(lrs)) > 1:
            out["lr_groups"] = lrs
        return out

    def state_blobs(self) -> dict[str, bytes]:
        """What a checkpoint keeps beside the per-element vectors: a user's optimizer's whole state
        and the scheduler's state, serialized by torch."""
        blobs = {}
        if not self.flat:
            blobs["optimizer"] = _dump(self.opt.state_dict())
        if self.scheduler is not None:
            blobs["scheduler"] = _dump(self.scheduler.state_dict())
        return blobs

    def restore(self, state: dict[str, Any] | None, blobs: dict[str, bytes], where: str) -> str:
        """Load a checkpoint's optimizer state: a built-in's state_dict `state` (per element) and
        `blobs` (state_blobs; `where`: the checkpoint, for the messages). With a schedule or a
        user's optimizer everything comes back exactly as it was; a built-in at a constant rate
        takes this run's --lr and --momentum instead (a resumed run is often restarted with another
        rate on purpose). Returns what was restored, in words for the log."""
        if self.flat:
            self.opt.load_state_dict(state)
        self.load_blobs(blobs, where)
        if self.scheduler is not None or not self.flat:
            return f"optimizer and schedule state from the checkpoint (lr {self.lrs()[0]:g})"
        group = self.opt.param_groups[0]
        before = {key: group[key] for key in ("lr", "momentum") if key in group}
        group["lr"] = self.recipe.lr
        if "momentum" in group and self.recipe.optimizer in ("momentum", "nesterov"):
            group["momentum"] = self.recipe.momentum
        changed = ", ".join(f"{k} {before[k]:g} -> {group[k]:g}" for k in before if before[k] != group[k])
        momentum = f", momentum {group['momentum']:g}" if "momentum" in before else ""
        return (f"optimizer state from the checkpoint; lr {group['lr']:g}{momentum} from the flags"
                f"{f' ({changed})' if changed else ''}")

    def load_blobs(self, blobs: dict[str, bytes], where: str) -> None:
        """Restore state_blobs() (`where`: the checkpoint, for the messages)."""
        if not self.flat:
            if "optimizer" not in blobs:
                raise ConfigError(f"{where} holds no state of a user's optimizer: it was written with a built-in "
                                  f"one; resume with the same --optimizer")
            self.opt.load_state_dict(_load(blobs["optimizer"], where))
        if self.scheduler is not None and "scheduler" in blobs:
            self.scheduler.load_state_dict(_load(blobs["scheduler"], where))
            for group, lr in zip(self.opt.param_groups, self.scheduler.get_last_lr(), strict=False):
                group["lr"] = lr


def _module_on(w: np.ndarray, grad: np.ndarray, module: torch.nn.Module | None, label: str) -> torch.nn.Module:
    """A copy of `module` whose parameters are views of `w` and their .grad views of `grad`."""
    if module is None:
        raise ConfigError(f"--optimizer {label or 'factory'}: a user's optimizer needs a torch model to build it on; "
                          f"with a synthetic --problem use a built-in optimizer ({', '.join(OPTIMIZERS)})")
    module = copy.deepcopy(module)
    flat, flat_grad = torch.from_numpy(w), torch.from_numpy(grad)
    offset = 0
    for p in module.parameters():
        size = p.numel()
        if offset + size > len(w):
            break
        p.data = flat[offset:offset + size].view_as(p)
        p.grad = flat_grad[offset:offset + size].view_as(p)
        offset += size
    if offset != len(w) or sum(p.numel() for p in module.parameters()) != len(w):
        raise ConfigError(f"the master's parameters ({len(w)} values) are not the model's "
                          f"({sum(p.numel() for p in module.parameters())}): a user's optimizer needs the whole model "
                          f"on one server (use --servers 1)")
    return module


def _user_optimizer(factory: Callable, module: torch.nn.Module, label: str) -> torch.optim.Optimizer:
    """factory(module), checked: an Optimizer over the module's parameters only."""
    name = label or getattr(factory, "__qualname__", "the optimizer factory")
    try:
        opt = factory(module)
    except Exception as exc:  # noqa: BLE001 - the user's factory
        raise ConfigError(f"optimizer factory {name} failed: {_first_line(exc)}") from None
    if not isinstance(opt, torch.optim.Optimizer):
        raise ConfigError(f"optimizer factory {name} returned {type(opt).__name__}, not a torch.optim.Optimizer: "
                          f"return e.g. torch.optim.SGD(model.parameters(), lr=0.1)")
    own = {id(p) for p in module.parameters()}
    foreign = sum(id(p) not in own for group in opt.param_groups for p in group["params"])
    if foreign:
        raise ConfigError(f"optimizer factory {name} optimizes {foreign} tensors that are not the model's parameters: "
                          f"build it on the model it is given (model.parameters() or named_parameters())")
    return opt


def _scheduler(factory: Callable | None, opt: torch.optim.Optimizer, recipe: Recipe, label: str):
    """The user's scheduler factory(opt), checked, or the recipe's built-in schedule (None: constant)."""
    if factory is None:
        if not recipe.scheduled:
            return None
        if recipe.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"--lr-schedule {recipe.lr_schedule!r} is not one of: {', '.join(LR_SCHEDULES)}")
        return torch.optim.lr_scheduler.LambdaLR(opt, schedule_factor(recipe))
    name = label or getattr(factory, "__qualname__", "the scheduler factory")
    try:
        sched = factory(opt)
    except Exception as exc:  # noqa: BLE001 - the user's factory
        raise ConfigError(f"scheduler factory {name} failed: {_first_line(exc)}") from None
    if not isinstance(sched, torch.optim.lr_scheduler.LRScheduler):
        raise ConfigError(f"scheduler factory {name} returned {type(sched).__name__}, not a torch LRScheduler: "
                          f"return e.g. torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)")
    if sched.optimizer is not opt:
        raise ConfigError(f"scheduler factory {name} built its scheduler on another optimizer: build it on the "
                          f"optimizer it is given")
    return sched


def _dump(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _load(blob: bytes, where: str) -> dict:
    """A torch-serialized state, read without running code (weights_only) and checked finite."""
    try:
        state = torch.load(io.BytesIO(blob), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged or crafted blob
        raise ConfigError(f"{where}: its optimizer or scheduler state cannot be read ({_first_line(exc)}); "
                          f"use another checkpoint") from None
    tensors = [v for entry in state.get("state", {}).values() if isinstance(entry, dict)
               for v in entry.values() if torch.is_tensor(v) and v.is_floating_point()]
    if not all(torch.isfinite(t).all() for t in tensors):
        raise ConfigError(f"{where}: its optimizer state contains NaN or Inf; resume from an earlier checkpoint")
    return state


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
