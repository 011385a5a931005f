"""The user's training recipe on the job's side: the Python objects pgc_mpi.fit was given
(RecipeObjects), rank 0's update built from them (initial_update), and the callbacks on rank 0
(pgc_mpi.runs.callbacks): which ones a run has, the handle their on_start receives, their state
restored on a resume."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import TrainConfig
from ..core.shards import shard_bounds
from ..core.wire import wire_format
from ..errors import PgcError
from ..learning.plugins import is_spec


@dataclass(frozen=True)
class RecipeObjects:
    """The recipe's Python objects that pgc_mpi.fit was given (pgc-train's flags name them instead,
    PATH:NAME): an optimizer factory model -> torch.optim.Optimizer and a scheduler factory
    optimizer -> LRScheduler (pgc_mpi.learning.optim.make_update), and callbacks
    (pgc_mpi.runs.callbacks), which run on rank 0."""

    optimizer: Callable | None = None
    scheduler: Callable | None = None
    callbacks: tuple = ()

    def has_factories(self, cfg: TrainConfig) -> bool:
        """Whether the update is built by a factory: these objects', or --optimizer / --scheduler PATH:NAME."""
        return bool(self.optimizer or self.scheduler or cfg.scheduler or is_spec(cfg.optimizer))


def initial_update(cfg: TrainConfig, problem, recipe: RecipeObjects, params: np.ndarray | None = None) -> tuple:
    """Rank 0's initial parameters in the run's dtype (`params`, when given: built already) and the
    update over its shard of them (the first torch optimizer of a process takes about a second)."""
    from ..learning.optim import make_update

    own = shard_bounds(problem.dim, cfg.servers)[0]
    if params is None:
        params = problem.initial_params().astype(wire_format(cfg.wire_dtype, cfg.dtype).compute)
    return params, make_update(cfg, params[own], problem, recipe)


def run_callbacks(cfg: TrainConfig, recipe: RecipeObjects):
    """The run's callbacks on rank 0: the built-ins its options ask for, then pgc_mpi.fit's (None: none)."""
    from ..runs.callbacks import Callbacks, callbacks_from_config

    chosen = [*callbacks_from_config(cfg), *recipe.callbacks]
    return Callbacks(chosen) if chosen else None


@dataclass
class RunHandle:
    """What a callback's on_start(run) is given: the run folder, the step a resume started at
    (None: a fresh start), and save_checkpoint(name) (a checkpoint of the state now under that
    name, e.g. best.h5; not in a ddp run, which has no checkpoints)."""

    out: Path
    resumed_at: int | None
    _master: object = None

    def save_checkpoint(self, name: str) -> Path:
        """Write a checkpoint of the state after the steps done so far as OUT/checkpoints/<name>.h5."""
        if self._master is None:
            raise PgcError("save_checkpoint: this run has no checkpoints (--scheme ddp)")
        return self._master.checkpoint(name)


def start_callbacks(control, master, out: Path, resume) -> None:
    """The callbacks' state from the checkpoint resumed from, then their on_start."""
    if control.callbacks is None:
        return
    if resume is not None:
        control.restore(getattr(resume, "blobs", {}))
    control.callbacks.start(RunHandle(Path(out), resume.step if resume is not None else None, master))
