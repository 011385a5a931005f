"""One simulated run's configuration (pgc-sim, pgc_mpi.simulate): SimConfig, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from .core import CoreConfig, _is_number, _positive, _positive_int


@dataclass(frozen=True)
class SimConfig(CoreConfig):
    """One simulated run (pgc-sim, pgc_mpi.sim.simulator.simulate), validated on construction.

    workers: simulated workers; compute_time: simulated seconds of one partition gradient;
    target_gap: stop once the optimality gap F(w) - F* is at most this (None: run all steps);
    probe_every: steps between two probes of pbs's diagnostics (pgc-train probes at --eval-every);
    target_loss: stop once the evaluated loss (the training loss; the test loss where the
    evaluation has none) is at most this (None: run all steps); eval_every: evaluate the problem
    every this many steps and after the last one (a step record carries its metrics only then);
    master_cost: a JSON cost model of the master's own work (pgc_mpi.sim.master_cost), charged on the
    simulated clock (None: the master takes no time); target_accuracy: stop once the evaluated
    accuracy (the test accuracy; the validation accuracy of a synthetic logistic problem; the
    training accuracy where the evaluation has no other) is at least this (None: run all steps).
    (--abandon-late is a shared option: CoreConfig.abandon_late.)
    """

    workers: int = 12
    compute_time: float = 1.0
    target_gap: float | None = None
    probe_every: int = 20  # pbs diagnostics' probes, as pgc-train's --eval-every (default 20)
    target_loss: float | None = None
    eval_every: int = 1
    master_cost: str | None = None  # a cost model file (pgc_mpi.sim.master_cost); None: the master takes no time
    target_accuracy: float | None = None

    def __post_init__(self) -> None:
        self.validate_core(self.workers)
        if self.master_cost is not None and not isinstance(self.master_cost, str):
            raise ConfigError(f"--master-cost must be a file name, got {self.master_cost!r}")
        # the file itself is read (and refused, if it must be) by the simulator before its first step,
        # and by pgc-sim with the other options (pgc_mpi.sim.cli): the simulator's layer owns its format
        _positive("compute-time", self.compute_time)
        _positive_int("probe-every", self.probe_every)
        _positive_int("eval-every", self.eval_every)
        if self.target_gap is not None and not (_is_number(self.target_gap) and 0 <= self.target_gap < math.inf):
            raise ConfigError(f"--target-gap must be a finite number >= 0, got {self.target_gap!r}")
        if self.target_loss is not None and not (_is_number(self.target_loss) and math.isfinite(self.target_loss)):
            raise ConfigError(f"--target-loss must be a finite number, got {self.target_loss!r}")
        if self.target_accuracy is not None and not (_is_number(self.target_accuracy)
                                                     and 0 <= self.target_accuracy <= 1):
            raise ConfigError(f"--target-accuracy must be a number in [0, 1], got {self.target_accuracy!r}")
