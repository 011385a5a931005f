"""The run folder: one run's outputs, never mixed with another run's.

pgc-train writes config.json, metrics.jsonl, messages.bin, checkpoints/ and params.npy into its
output folder (`--out`). Before anything is written, rank 0 decides what the folder may receive (`plan`):

- a folder that holds none of those outputs (absent, empty, or holding only other files, such
  as a batch script's log): the run starts there;
- a folder holding a run: refused, unless `--resume` continues that run (its config.json must
  describe the same run: `differences`) or `--overwrite` deletes its outputs first (`clear`);
- a resume on other data than the run's (config.json's `data_fingerprint`) is refused once the
  data are loaded (`check_same_data`), unless `--resume-other-data` accepts them on purpose;
- `--resume auto`: the newest checkpoint of the run in the folder if it has one; otherwise the
  run starts afresh there (a run killed before its first checkpoint restarts from step 0, its
  partial outputs replaced), so a batch script can pass it on its first submission and after
  every requeue alike.

Default folder names cannot collide: under Slurm they are named after the job (and array task),
the same after a requeue so that the requeued job finds its run; elsewhere they carry the UTC
time and a random suffix.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from ..config import TrainConfig, slurm_run_name
from ..core.age_weights import applied_correction
from ..errors import ConfigError

_CHECKPOINT = re.compile(r"ckpt-(\d{8})\.h5$")
# config.json first: see clear()
OUTPUTS = ("config.json", "messages.bin", "metrics.jsonl", "checkpoints", "params.npy")

# Options that may change when a run is resumed: when and how much to train, evaluate, checkpoint
# and log, and where things are. Every other option shapes the trajectory and must match.
MAY_CHANGE_ON_RESUME = frozenset({
    "steps", "out", "resume", "overwrite", "eval_every", "target_loss", "checkpoint_every", "keep_checkpoints",
    "grace", "lost_after", "poll_interval", "threads", "verify_data", "record_params", "eval_train", "log_interval",
    "log_level",
    "log_dir", "device", "master_device", "share_gpus", "servers", "memory_check",
    "loader_workers", "prefetch",  # where minibatches are read, not which: the same bits either way
    # the number of workers, too: a run resumes on the workers it has (an elastic restart after
    # lost workers; the placement is rebuilt for the new n: pgc_mpi.runs.checkpoint.load)
    "workers",
    # whether a resume may continue on other data than the run's: see check_same_data
    "resume_other_data",
})


def default_out(scheme: str) -> Path:
    """runs/<scheme>-slurm<job>[_<task>] under Slurm, else runs/<scheme>-<UTC time>-<6 random hex digits>."""
    slurm = slurm_run_name()
    if slurm:
        return Path("runs") / f"{scheme}-{slurm}"
    return Path("runs") / f"{scheme}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def holds_run(out: Path) -> bool:
    """Whether `out` holds any of a run's outputs."""
    return any((out / name).exists() for name in OUTPUTS)


def differences(cfg: TrainConfig, workers: int, recorded: dict[str, Any]) -> list[str]:
    """The options in which `cfg` with `workers` differs from a config.json's run, as
    'name X (this run: Y)' (empty: the same run)."""
    theirs = dict(recorded.get("config", {}))
    theirs["workers"] = recorded.get("workers")
    mine = {**cfg.to_dict(), "workers": workers}
    # compared as applied: a scheme without stale buffers ignores it, and a record from before the
    # option used the paper's estimator
    for side in (theirs, mine):
        side["staleness_correction"] = applied_correction(str(side.get("scheme")), side.get("staleness_correction"))
    return [f"{name} {theirs.get(name)!r} (this run: {value!r})" for name, value in mine.items()
            if name not in MAY_CHANGE_ON_RESUME and theirs.get(name) != value]


def _recorded(out: Path) -> dict[str, Any] | None:
    """The folder's config.json (None when it has none)."""
    path = out / "config.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc}); move the folder away or use --overwrite") from None


def _check_same_run(cfg: TrainConfig, workers: int, out: Path) -> None:
    recorded = _recorded(out)
    if recorded is None:
        raise ConfigError(f"--resume {cfg.resume}: {out} holds outputs of a run but no config.json to check "
                          f"them against; use --overwrite to start afresh there, or another --out")
    diff = differences(cfg, workers, recorded)
    if diff:
        raise ConfigError(f"--resume {cfg.resume}: {out}/config.json describes another run: {'; '.join(diff)}; "
                          f"resume with the same options, or use another --out (or --overwrite to replace it)")


def data_differences(recorded: dict[str, Any] | None, fingerprint: dict[str, str | None] | None) -> list[str]:
    """The splits ('training', 'test') whose data differ from those a config.json recorded
    (`data_fingerprint`, pgc_mpi.learning.fingerprint), and 'partitioning X (this run: Y)' where the
    partitions are cut otherwise (--partitioning; a record without one was iid). Unknown is no difference: a config.json
    written before fingerprints were recorded, or data without one (an HDF5 file, a synthetic
    problem), so that such runs still resume."""
    theirs = (recorded or {}).get("data_fingerprint")
    if not theirs or fingerprint is None:
        return []
    found = [word for split, word in (("train", "training"), ("test", "test"))
             if split in theirs and theirs[split] != fingerprint.get(split)]
    # the partitions too (--partitioning; absent: iid): the same data cut otherwise is another run
    if theirs.get("partitioning", "iid") != fingerprint.get("partitioning", "iid"):
        found.append(f"partitioning {theirs.get('partitioning', 'iid')} (this run: "
                     f"{fingerprint.get('partitioning', 'iid')})")
    return found


def check_same_data(cfg: TrainConfig, problem: Any) -> None:
    """Rank 0, on a resume, once its problem is built and before the checkpoint is loaded: ConfigError
    when the problem's data differ from those of the run in --out (its config.json), unless
    `resume_other_data` accepts them on purpose (open_outputs then records the change in config.json).
    The options alone cannot tell: they name a fit's arrays only as "arrays", a Dataset by its class."""
    from ..learning.fingerprint import describe, problem_fingerprint

    out = Path(cfg.out)
    if not cfg.resume or cfg.resume_other_data:
        return
    mine = problem_fingerprint(problem)
    recorded = _recorded(out)
    changed = data_differences(recorded, mine)
    if changed and changed[-1].startswith("partitioning"):
        raise ConfigError(f"--resume {cfg.resume}: this run's partitions differ from those of the run in {out}: "
                          f"{changed[-1]}; resume with the run's --partitioning, or use another --out")
    if changed:
        theirs = recorded["data_fingerprint"]
        split = "train" if "training" in changed else "test"
        raise ConfigError(f"--resume {cfg.resume}: this run's {' and '.join(changed)} data differ from those of the "
                          f"run in {out} (fingerprint {describe(mine.get(split))}, its config.json's "
                          f"{describe(theirs.get(split))}): resume on the same data (seed what draws it, load the same "
                          f"files), or accept this data on purpose with resume_other_data=True (--resume-other-data)")


def plan(cfg: TrainConfig, workers: int) -> TrainConfig:
    """Rank 0, before anything is written: the configuration with its output folder settled
    (`out` set; `resume` resolved: `auto` becomes `latest` when the folder has a checkpoint, else
    none with `overwrite` for the folder's partial outputs), or ConfigError when the folder holds
    another run's outputs and neither --resume nor --overwrite says what to do with them."""
    from dataclasses import replace

    out = resolve_out(cfg)
    cfg = replace(cfg, out=str(out))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder; choose another --out")
    if cfg.resume == "auto":
        if not holds_run(out):
            return replace(cfg, resume=None)
        _check_same_run(cfg, workers, out)
        from .results import run_completed, stopped_by_callback

        step = stopped_by_callback(out)
        if step is not None:  # finished as the user's callback wished: a requeue must not train it on
            raise ConfigError(f"--resume auto: {out} holds a run that a callback stopped after step {step} (it is "
                              f"finished); to train on, resume it with --resume latest, or use --overwrite or "
                              f"another --out")
        if list_checkpoints(out / "checkpoints"):
            return replace(cfg, resume="latest")

        if run_completed(out):  # nothing to continue from, and starting again would delete a finished run
            raise ConfigError(f"--resume auto: {out} holds a completed run and no checkpoint to continue it from; "
                              f"use --overwrite to run it again, or another --out")
        return replace(cfg, resume=None, overwrite=True)  # killed before its first checkpoint: start it again
    if cfg.resume is not None:
        if holds_run(out) and (out / "metrics.jsonl").exists():
            _check_same_run(cfg, workers, out)
        return cfg
    if holds_run(out) and not cfg.overwrite:
        present = ", ".join(name for name in OUTPUTS if (out / name).exists())
        raise ConfigError(f"--out {out} already holds a run ({present}); continue it with --resume auto, delete "
                          f"its outputs with --overwrite, or choose another --out")
    return cfg


def resolve_out(cfg: TrainConfig) -> Path:
    """The run's output folder: --out, else the folder of a --resume checkpoint file, else a
    default name (default_out)."""
    return Path(cfg.out) if cfg.out else _resume_folder(cfg) or default_out(cfg.scheme)


def _resume_folder(cfg: TrainConfig) -> Path | None:
    """The run a --resume checkpoint file belongs to (OUT/checkpoints/ckpt-N.h5), when --out is not given."""
    if cfg.resume and cfg.resume not in ("latest", "auto"):
        return Path(cfg.resume).resolve().parent.parent
    return None


def clear(out: Path) -> None:
    """Delete a run's outputs from `out` (--overwrite), leaving other files alone.

    They are first moved, config.json first, into one hidden folder inside `out` (renames: each
    atomic), which is then deleted; a crash part-way leaves that folder and possibly some
    outputs without a config.json, which the next run refuses or clears, never a mix that reads
    as one run."""
    trash = out / f".overwritten-{secrets.token_hex(4)}"
    trash.mkdir()
    for name in OUTPUTS:
        if (out / name).exists():
            (out / name).rename(trash / name)
    shutil.rmtree(trash)
    for stale in out.glob(".overwritten-*"):  # left by an earlier crash
        shutil.rmtree(stale, ignore_errors=True)


def drop_checkpoints_after(directory: Path, step: int) -> list[Path]:
    """Remove the checkpoints of steps after `step` (a resume from an older checkpoint abandons
    them: kept, they would mix with the resumed run's and the retention would keep the wrong
    ones). Returns the removed files."""
    dropped = [p for p in list_checkpoints(directory) if checkpoint_step(p) > step]
    for path in dropped:
        path.unlink()
    return dropped


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint of the state before `step`."""
    return f"ckpt-{step:08d}.h5"


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint file, from its name."""
    match = _CHECKPOINT.search(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not named like a checkpoint (ckpt-NNNNNNNN.h5)")
    return int(match.group(1))


def list_checkpoints(directory: Path) -> list[Path]:
    """The checkpoints in a directory, oldest first (names sort by step)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _CHECKPOINT.search(p.name))
