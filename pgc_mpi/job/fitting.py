"""`pgc_mpi.fit`: train your own PyTorch model, loss and data from a script run under MPI.

    mpiexec -n 5 python train_mine.py          # or: srun python train_mine.py

Every rank runs the script and calls fit() with the same arguments; rank 0 becomes the master
and the others the workers, exactly as under pgc-train, which is a thin caller of the same job
(pgc_mpi.job.train.run_job): the same options with the same names, defaults and checks, the same run
folder, metrics, checkpoints, `resume="auto"`, signals, deadlines and faults.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import TrainConfig, config_from_options
from ..errors import ConfigError


@dataclass
class FitResult:
    """What fit() returns on rank 0: the run's summary record (as in metrics.jsonl), its folder,
    the final parameters as one flat vector, and rank 0's model holding them (None for a
    synthetic --problem)."""

    summary: dict
    out: Path
    params: np.ndarray
    model: Any = None
    problem: Any = None  # rank 0's problem (a TorchProblem for a torch model): state_dict() asks it

    def state_dict(self) -> dict[str, Any]:
        """The trained model's torch state_dict (CPU tensors), as pgc-export writes it: the
        parameters `params` and the buffers (batch-norm running statistics...) as the run's
        evaluation computes them at those parameters (`model` is left holding both). ConfigError
        for a synthetic --problem, which has no torch model."""
        if self.problem is None or not hasattr(self.problem, "state_dict"):
            raise ConfigError("this run trained a synthetic --problem, not a torch model: it has no state_dict")
        return self.problem.state_dict(self.params)


def fit(model: Any = None, train_data: Any = None, *, loss: Callable | str | None = None, test_data: Any = None,
        metrics: Any = None, collate_fn: Callable | None = None, optimizer: Callable | str | None = None,
        scheduler: Callable | None = None, callbacks: Iterable[Any] = (), **options: Any) -> FitResult | None:
    """Train `model` on `train_data` with a straggler-tolerant scheme, on every rank of MPI's world.

    model: a torch.nn.Module, or (preferred) a zero-argument factory of one (a function or an
        nn.Module class: every rank builds it, seeded with `seed`; rank 0's initial weights are
        the ones trained), a built-in name ('logreg', 'mlp', 'cnn', ...) or 'PATH:NAME'
        (None: pgc-train's default, or the `problem` option's synthetic problem).
    train_data, test_data: `(x, y)` arrays (NumPy or torch; integer labels are classification,
        floating-point targets regression) or map-style torch Datasets giving `(x, y)` pairs,
        batched by `collate_fn` (torch's default_collate). None: the `dataset` option (a
        built-in name, an HDF5 file or PATH:NAME). Without test data, evaluations use the
        training data only. Every rank must give the same data (seeded, or read from the same
        files): before training, the ranks compare fingerprints of their training data
        (pgc_mpi.learning.fingerprint) and stop with exit status 2 where they differ; config.json
        records the fingerprints, and a resume on other data is refused unless
        `resume_other_data=True` accepts it on purpose.
    loss: a callable loss(output, target) -> scalar tensor, the mean over the minibatch (checked at
        start: a summed loss is refused); None: cross-entropy for integer labels, half the mean
        squared error for floating-point targets.
    metrics: callables metric(output, target) -> float over a whole split, reported in the eval
        records as train_<name> and test_<name> (a dict name -> callable, a list, or one);
        accuracy is reported for classification models that output logits.
    optimizer: a built-in name ('sgd', 'momentum', 'nesterov', 'adam', 'adamw') or a factory
        called once on the master with its copy of the model, returning any torch.optim.Optimizer
        over that model's parameters (param groups work: no weight decay on biases and norms);
        the parameters are views of the master's flat vector, their .grad of the decoded gradient.
    scheduler: a factory optimizer -> torch LRScheduler, stepped once per update (or the
        `lr_schedule` option: constant, cosine, linear, step, with `warmup_steps`, `min_lr`).
    callbacks: objects with any of on_start(run), on_step(record), on_eval(record),
        on_checkpoint(path), on_end(summary), run on rank 0 (pgc_mpi.runs.callbacks: built-ins
        EarlyStopping, BestCheckpoint, CSVLogger, TensorBoardLogger); an on_step or on_eval that
        returns True stops the run after that step (a checkpoint, exit status 0).
    **options: pgc-train's options with `_` for `-` (scheme="pgc-cr", stragglers=2, steps=500,
        lr=0.1, out="runs/mine", resume="auto", checkpoint_every=50, delay="exp:0.05", ...;
        `config` names a TOML file they override), with its defaults and checks.

    Returns a FitResult on rank 0 and None on the workers, once the run has ended. On a bad option
    or plug-in, rank 0 prints pgc-train's one-line error and every rank raises SystemExit(2);
    a run that diverged raises SystemExit(4) on every rank. A stop signal (SIGINT, SIGTERM,
    SIGUSR1) ends the job as under pgc-train: a checkpoint, the summary, exit status 3 (resume
    with resume="auto").
    """
    from . import entry, recipe, roles, train  # lazily: they import mpi4py, FitResult alone must not

    entry.prepare_process("pgc_mpi.fit")
    given = not all(isinstance(x, str) or x is None for x in (model, loss)) or train_data is not None or metrics
    make_parts = _parts_factory(model, train_data, test_data, loss, metrics, collate_fn) if given else None
    # on rank 0, whose errors every rank turns into its exit status
    configure = functools.partial(_configuration, model, train_data, test_data, loss, optimizer, scheduler, options)
    outcome = roles.JobOutcome()
    factories = {key: None if isinstance(value, str) else value for key, value in
                 (("optimizer", optimizer), ("scheduler", scheduler))}  # a name is the configuration's
    objects = recipe.RecipeObjects(**factories, callbacks=tuple(callbacks or ()))
    code = train.run_job(configure, [*sys.argv[1:]], make_parts, outcome, prog="pgc_mpi.fit", recipe=objects)
    if code != 0:
        raise SystemExit(code)
    return None if outcome.summary is None else _result(outcome)  # None: a worker


def _configuration(model: Any, train_data: Any, test_data: Any, loss: Any, optimizer: Any, scheduler: Any,
                   options: dict[str, Any]) -> TrainConfig:
    """fit's configuration: its options, with labels for the objects given (the model, the data,
    the loss, a factory optimizer or scheduler); a ConfigError for data given two ways or half."""
    if test_data is not None and train_data is None:
        raise ConfigError("test_data needs train_data: give both, or neither to use the dataset option")
    if train_data is not None and "dataset" in options:
        raise ConfigError("train_data and the dataset option exclude each other: give one of them")
    named = {key: value for key, value in (("optimizer", optimizer), ("scheduler", scheduler)) if value is not None}
    return config_from_options({**options, **_labels(model, train_data, loss),
                                **{key: value if isinstance(value, str) else _label(value)
                                   for key, value in named.items()}})


def _result(outcome: Any) -> FitResult:
    """Rank 0's FitResult of a finished job, the trained module (if any) holding its parameters."""
    trained = getattr(outcome.problem, "module", None)
    if trained is not None:
        outcome.problem.set_params(outcome.params)
    return FitResult(outcome.summary, Path(outcome.out), outcome.params, trained, problem=outcome.problem)


def _label(obj: Any) -> str:
    from ..learning.plugins import label_of

    return label_of(obj)


def _labels(model: Any, train_data: Any, loss: Any) -> dict[str, Any]:
    """The configuration's names of the objects given (config.json, the checkpoints' identity,
    resume's check that a folder holds the same run)."""
    from ..learning.plugins import label_of

    labels: dict[str, Any] = {}
    if model is not None:
        labels["model"] = model if isinstance(model, str) else label_of(model)
    if loss is not None:
        labels["loss"] = loss if isinstance(loss, str) else label_of(loss)
    if train_data is not None:
        labels["dataset"] = "arrays" if isinstance(train_data, (tuple, list)) else label_of(train_data)
    return labels


def _parts_factory(model, train_data, test_data, loss, metrics, collate_fn):
    """The parts of the problem, built on each rank once the configuration is valid (its seed
    and its dataset option are known then)."""

    def make(cfg: TrainConfig, verify: bool):
        from ..learning.parts import parts_of, source_from_spec
        from ..learning.user_data import source_of

        return parts_of(cfg.model if model is None else model,
                        lambda: (source_of(train_data, test_data, collate_fn) if train_data is not None else
                                 source_from_spec(cfg.dataset, cfg.seed, verify)),
                        loss, metrics)

    return make
