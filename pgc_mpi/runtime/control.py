"""The rules around the master's step loop: when to evaluate, checkpoint and stop.

Kept apart from the loop so that each rule reads (and is tested) on its own: evaluations every
`eval_every` steps and at the end, the target-loss rule, checkpoints every `checkpoint_every`
steps or on demand (the file OUT/CHECKPOINT, or SIGUSR2), and stop signals (SIGUSR1/SIGTERM).
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import signals

if TYPE_CHECKING:
    from ..runs.callbacks import Callbacks
    from .servers import Leader

log = logging.getLogger("pgc_mpi")

# The learning-rate warning: the full training loss rose over 2 consecutive evaluations, by at least
# this fraction in all. Smaller rises are SGD noise at a sound learning rate: Fashion-MNIST/logreg at
# --lr 0.05 (pgc-cr, 4 workers) has two rises in a row of up to 19% near its plateau; at --lr 0.1
# they reach 36-115%, at the default 0.5 80% (from above the untrained loss).
# The step loops' pace (pgc_mpi.runtime.master, .following). While waiting past a missed deadline
# (policy `wait`), remind the log this often.
WAIT_REMINDER = 30.0
# Longest wait between two looks at the models in flight (a worker's answer goes out only once
# the previous model message to it has been delivered).
DISPATCH_INTERVAL = 0.05
LR_WARNING_RISE = 0.25


@dataclass(frozen=True)
class ControlSettings:
    """The settings these rules read (a subset of the run's configuration)."""

    steps: int
    eval_every: int = 20
    target_loss: float | None = None
    checkpoint_every: int | None = None
    lr: float | None = None  # named in the warning that training loss keeps rising

    def evaluation_due(self, step: int) -> bool:
        """Whether the run evaluates after `step`: every `eval_every` steps and after the last."""
        return (step + 1) % self.eval_every == 0 or step + 1 == self.steps


@dataclass
class RunControl:
    """Decides, after every step, whether to evaluate, checkpoint or stop.

    `evaluate()` returns the metrics of the current parameters (e.g. TorchProblem.evaluate);
    its wall time is kept in `eval_seconds` so that training time can leave it out. `write`
    receives each evaluation's record (the metrics file's writer)."""

    settings: ControlSettings
    out: Path
    evaluate: Callable[[], dict]
    write: Callable[[dict], None]
    last_eval: dict = field(default_factory=dict)
    eval_seconds: float = 0.0
    stopped_by: str | None = None  # the signal that stopped the run
    stopped_early: bool = False  # the target loss was reached before the last step
    _recent_losses: list[float] = field(default_factory=list)
    _eval_losses: list[float] = field(default_factory=list)  # the full training loss of each evaluation
    warned_lr: bool = False  # the learning-rate warning was given (it is given once)
    servers: Leader | None = None  # --servers K: the other servers, told each step rank 0 has done
    callbacks: Callbacks | None = None  # the user's and the built-in callbacks (pgc_mpi.runs.callbacks)
    stopped_by_callback: bool = False  # a callback asked to stop: a finished run (exit status 0)

    def may_update(self, step: int, lr: float) -> bool:
        """Step `step` is decoded here and will be applied with learning rate `lr`: the other
        servers may apply it too, with the same rate."""
        if self.servers is not None:
            self.servers.commit(step, lr)
        return True

    def stop_signal(self, step: int) -> bool:
        """Whether a stop signal arrived (logged once); the step in progress is then abandoned."""
        name = signals.requested()
        if name is not None and self.stopped_by is None:
            log.warning("%s received during step %d: stopping (metrics are kept; exit status %d asks to requeue)",
                        name, step, signals.EXIT_STOPPED)
            self.stopped_by = name
        return name is not None

    def checkpoint_requested(self) -> bool:
        """A checkpoint on demand: the file OUT/CHECKPOINT (removed once seen) or SIGUSR2 to rank 0.

        (MPICH's mpiexec does not forward SIGUSR2 - it dies of it - so the file works with every launcher.)"""
        trigger = self.out / "CHECKPOINT"
        if trigger.exists():
            trigger.unlink(missing_ok=True)
            return True
        return signals.checkpoint_requested()

    def checkpoint_due(self, done: int) -> bool:
        """Whether to checkpoint after `done` steps, before the last one (the end has its own rule)."""
        every = self.settings.checkpoint_every
        due = bool(every) and done % every == 0
        return (due or self.checkpoint_requested()) and done < self.settings.steps

    def checkpoint_at_end(self) -> bool:
        """Whether to checkpoint when the loop ends: with --checkpoint-every, after a stop signal or a
        callback's, or on demand."""
        return (self.settings.checkpoint_every is not None or self.stopped_by is not None or self.stopped_by_callback
                or self.checkpoint_requested())

    def checkpointed(self, path: Path) -> None:
        """A checkpoint was written: the callbacks' on_checkpoint."""
        if self.callbacks is not None:
            self.callbacks.checkpoint(path)

    def state_blobs(self) -> dict[str, bytes]:
        """What a checkpoint keeps of the rules: the callbacks' state (early stopping's counters...)."""
        if self.callbacks is None:
            return {}
        return {"callbacks": json.dumps(self.callbacks.state_dict()).encode()}

    def restore(self, blobs: dict[str, bytes]) -> None:
        """The callbacks' state from a checkpoint's blobs (state_blobs)."""
        if self.callbacks is not None and "callbacks" in blobs:
            self.callbacks.load_state_dict(json.loads(blobs["callbacks"].decode()))

    def end(self, summary: dict) -> None:
        """The run has ended with this summary: the callbacks' on_end."""
        if self.callbacks is not None:
            self.callbacks.end(summary)

    def after_step(self, step: int, train_loss: float, record: dict | None = None) -> bool:
        """The step's record to the callbacks, then evaluate when due and apply the target-loss
        rule and the callbacks' wishes; returns True when the run should stop."""
        asked = self.callbacks is not None and record is not None and self.callbacks.step(record)
        stop = self._evaluate_after(step, train_loss)
        if asked and not self.stopped_by_callback:
            self._stop_for_callback(step)
        return stop or self.stopped_by_callback

    def _stop_for_callback(self, step: int) -> None:
        self.stopped_by_callback = True
        log.info("step %d: a callback asked to stop; ending the run with a checkpoint", step + 1)

    def _evaluate_after(self, step: int, train_loss: float) -> bool:
        """Evaluate when due and apply the target-loss rule; True when the run should stop."""
        self._recent_losses = [*self._recent_losses[-self.settings.eval_every + 1:], train_loss]
        last = step + 1 == self.settings.steps
        stop = self.stop_signal(step + 1) and not last
        if not self.settings.evaluation_due(step) and not stop:
            return False
        began = time.monotonic()
        metrics = self.evaluate()
        self.eval_seconds += time.monotonic() - began
        self.last_eval = {"step": step, **metrics}
        self.write({"event": "eval", **self.last_eval})
        log.info("step %d eval: %s", step + 1, describe(metrics))
        if self.callbacks is not None and self.callbacks.eval(self.last_eval) and not last:
            self._stop_for_callback(step)
        self._watch_training_loss(metrics.get("train_loss"))
        target = self.settings.target_loss
        # without a full training-set evaluation, the target is checked on the recent minibatch losses
        loss = metrics.get("train_loss", _nanmean(self._recent_losses))
        if target is not None and loss <= target:
            log.info("step %d: training loss %.4f reached the target %.4g", step + 1, loss, target)
            self.stopped_early = not last
            return True
        return stop

    def _watch_training_loss(self, loss: float | None) -> None:
        """Warn (once) when the full training loss has risen over two consecutive evaluations, by
        LR_WARNING_RISE or more: almost always a learning rate too high for the data (the default
        suits the built-in digits, not e.g. Fashion-MNIST)."""
        if loss is None:
            return  # no full training loss evaluated (--eval-train false)
        if not math.isfinite(loss):  # divergence, which is reported on its own: start counting afresh
            self._eval_losses = []
            return
        self._eval_losses = [*self._eval_losses[-2:], float(loss)]
        last3 = self._eval_losses
        if self.warned_lr or len(last3) < 3 or not last3[0] < last3[1] < last3[2]:
            return
        if last3[2] < last3[0] * (1 + LR_WARNING_RISE):
            return
        self.warned_lr = True
        lr = f" (--lr {self.settings.lr:g})" if self.settings.lr is not None else " (--lr)"
        log.warning("training loss rose over the last 2 evaluations (%s): the learning rate%s is likely too high; "
                    "try a smaller one", " -> ".join(f"{v:.4g}" for v in last3), lr)


def describe(metrics: dict) -> str:
    """An evaluation's metrics in words: 'train loss 0.4100, test loss 0.4500, test accuracy 87.2%'."""
    parts = []
    for key, value in metrics.items():
        name = key.replace("_", " ")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            parts.append(f"{name} {value}")
        elif key.endswith("accuracy"):
            parts.append(f"{name} {100 * value:.1f}%")
        else:
            parts.append(f"{name} {value:.4f}")
    return ", ".join(parts)


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan
