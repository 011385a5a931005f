"""Run configurations: one configuration core and what each command adds.

- core: CoreConfig, the settings pgc-train and pgc-sim share (scheme, s, c, steps, optimizer,
  delays, deadline, seed), with one set of defaults and one validation, and the shared checks;
- train: TrainConfig (pgc-train, pgc_mpi.fit), from a TOML file or fit's keywords;
- sim: SimConfig (pgc-sim, pgc_mpi.simulate);
- options: every option's help text and the parsers built from the fields (pgc-train's
  build_parser; pgc-sim adds the shared group), and a script's flags for fit.

pgc-train's precedence: built-in defaults < --config FILE.toml < command-line flags. Everything is
validated here, with messages that say what to change. No module here imports torch or mpi4py
(`pgc-train --help`, a configuration error on rank 0, `pgc-sim --help` and `pgc-bench --dry-run`
stay fast). The names below are this package's public face.
"""

from __future__ import annotations

from .core import (
    CORE_FIELDS,
    MAX_SEED,
    CoreConfig,
    available_cores,
    check_deadline,
    check_plugin_names,
    parse_max_staleness,
    refuse_mixed_problem,
)
from .options import (
    _add_field_options,
    add_core_options,
    build_parser,
    config_from_args,
    options_from_args,
    show_default,
)
from .sim import SimConfig
from .train import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_DATASET,
    DEFAULT_MODEL,
    LOG_LEVELS,
    MATRIX_ELEMENTS_LIMIT,
    SYNTHETIC_DEFAULTS,
    TrainConfig,
    config_from_options,
    load_toml,
    slurm_run_name,
    tomllib,
)

__all__ = [
    "CORE_FIELDS", "DEFAULT_BATCH_SIZE", "DEFAULT_DATASET", "DEFAULT_MODEL", "LOG_LEVELS", "MATRIX_ELEMENTS_LIMIT",
    "MAX_SEED", "SYNTHETIC_DEFAULTS", "CoreConfig", "SimConfig", "TrainConfig", "_add_field_options",
    "add_core_options", "available_cores", "build_parser", "check_deadline", "check_plugin_names",
    "config_from_args", "config_from_options", "load_toml", "options_from_args", "parse_max_staleness",
    "refuse_mixed_problem", "show_default", "slurm_run_name", "tomllib",
]
