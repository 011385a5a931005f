"""pgc-bench's simulator backend: one run of an experiment simulated and written as a run folder.

With `backend = "sim"` in an experiment file, every run is `pgc_mpi.simulate` on the experiment's
torch model and data set (the same `dataset`, `model`, `batch_size`, `dtype` options as
pgc-train) instead of an MPI job, and its outputs have pgc-train's layout (config.json,
metrics.jsonl with step, eval and summary records, the step records' per-message lists in
messages.bin: pgc_mpi.runs.message_log), so the same gather, statistics and figures apply
(SimResult.records in memory keep the lists). Times are simulated: every partition gradient
takes `compute_time` seconds (required) plus the injected delays; what the simulator leaves
out is measured in docs/BENCHMARKS.md (the simulator against the MPI runtime). pgc-train options
the simulator has no use for (checkpoints, polling, threads, ...) are ignored; ddp is not
simulated (its simulated equivalent is dgd).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..config import CORE_FIELDS, SimConfig, TrainConfig
from ..errors import ConfigError
from ..runs.metrics import MetricsWriter, write_json

# pgc-train options a simulated run honours besides the shared ones (CORE_FIELDS)
PROBLEM_OPTIONS = ("dataset", "model", "loss", "batch_size", "dtype", "eval_train")
SIM_OPTIONS = ("compute_time", "eval_every")


def sim_config(options: dict[str, Any], workers: int) -> SimConfig:
    """The SimConfig of a run's pgc-train options (ConfigError if it cannot be simulated)."""
    if options.get("problem") is not None:
        raise ConfigError(f"backend \"sim\" simulates torch models only, not problem = \"{options['problem']}\": "
                          f"simulate synthetic problems with pgc-sim --problem, or use the MPI backend")
    if options.get("compute_time") is None:
        raise ConfigError("backend \"sim\" needs compute_time in [train]: the simulated seconds of one partition "
                          "gradient")
    values = {k: v for k, v in options.items() if k in CORE_FIELDS or k in SIM_OPTIONS}
    values.setdefault("eval_every", TrainConfig.eval_every)  # pgc-train's cadence, not the simulator's
    return SimConfig(**values, workers=workers)


def run_simulated(options: dict[str, Any], workers: int, out: Path) -> None:
    """Simulate one run and write it to `out` as pgc-train would have."""
    from ..learning.torch_problem import load_problem
    from .simulator import simulate

    cfg = sim_config(options, workers)
    defaults = TrainConfig()  # pgc-train's defaults for a torch model
    problem_options = {k: options.get(k, getattr(defaults, k)) for k in PROBLEM_OPTIONS}
    problem = load_problem(problem_options["dataset"], problem_options["model"], workers,
                           problem_options["batch_size"], seed=cfg.seed, dtype=problem_options["dtype"],
                           eval_train=problem_options["eval_train"], loss=problem_options["loss"],
                           partitioning=cfg.partitioning)
    scheme = cfg.make_scheme(workers)
    write_json(out / "config.json", {"config": {**dataclasses.asdict(cfg), **problem_options}, "workers": workers,
                                     "backend": "sim", **cfg.scheme_shape(scheme), "parameters": problem.dim})
    result = simulate(cfg, problem)
    metrics = MetricsWriter(out)
    evals = {e["step"]: e for e in result.evals}
    try:
        for record in result.records:
            metrics.write(record)
            if record["step"] in evals:  # the simulator evaluated after this step
                metrics.write({"event": "eval", **{k: v for k, v in evals[record["step"]].items() if k != "wall_time"}})
        metrics.write({"event": "summary", "status": "stalled: " + result.stalled if result.stalled else "completed",
                       "steps": len(result.records), "backend": "sim"})
    finally:
        metrics.close()

