"""Checkpoints: the master's training state in one HDF5 file, written atomically (`save`); this
module is also where the rest of pgc_mpi imports checkpoints from (it re-exports the reading and
the integrity modules' names).

A checkpoint `ckpt-00001200.h5` holds everything the master needs to go on from step 1200:
  params                    the flat parameters after 1199 steps (float32 or float64)
  optimizer/<key>           the torch optimizer's per-parameter state (momentum, Adam moments...)
  encoding_matrix           the scheme's B (coded schemes), checked on resume
  table/grads, versions     pbs's partition table
  buffers/<name>            a torch model's buffers (batch-norm running statistics...) as an
                            evaluation at `params` computes them, with the attribute
                            state_layout: the model's state_dict entries (JSON), so that
                            read_state_dict rebuilds the state_dict (pgc-export)
  blobs/<name>              opaque byte strings the master stores (uint8)
  attributes                format, step, scheme, n, s, c, dim, dtype, model and dataset (or
                            a synthetic problem and its samples), the
                            configuration (JSON), the optimizer's param groups (JSON), the master's
                            torch RNG state, the straggler model's spec and seed.
Everything random in a run is a pure function of (seed, step, worker, ...) - minibatches, delays,
gc-cr's B - so the seed and the step are the whole RNG state; the torch RNG is stored as well.
Workers' stale buffers are not stored: after a resume every pipelined worker rebuilds them by a
warm-up at the resumed model (see CodedScheme.warmup_versions).

Written to a temporary name, flushed, fsynced and renamed, so a crash mid-write never leaves a
file under a checkpoint's name; the last `keep` checkpoints are kept. A checkpoint saved under a
name (`best.h5`) is not a step checkpoint: never listed as one, never pruned.

Its integrity (a SHA-256 digest in the file's HDF5 user block, verified before HDF5 reads the
file; `seal`, `verify`) is pgc_mpi.runs.checkpoint_integrity's; reading it back, checked against
the run (`load`, `load_resume` past damaged files, `read_state_dict`) is
pgc_mpi.runs.checkpoint_reading's. Every failure is one line: CheckpointError, or its subclass
DamagedCheckpointError for damage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..learning.h5format import USERBLOCK, atomic_h5
from .checkpoint_integrity import CheckpointError, DamagedCheckpointError, digest_block, seal, verify
from .checkpoint_reading import (
    FORMAT,
    Checkpoint,
    check_layout,
    h5_key,
    load,
    load_resume,
    read_state_dict,
    resolve,
)
from .run_folder import checkpoint_name, checkpoint_step, list_checkpoints

__all__ = ["FORMAT", "USERBLOCK", "Checkpoint", "CheckpointError", "Checkpointer", "DamagedCheckpointError",
           "digest_block", "load", "load_resume", "read_state_dict", "resolve", "run_identity", "save", "seal",
           "verify"]


def run_identity(scheme, dim: int, *, dtype: str, model: str | None, dataset: str | None, seed: int,
                 optimizer: str, problem: str | None = None, samples: int | None = None,
                 loss: str | None = None) -> dict[str, Any]:
    """What a checkpoint must match to be resumed by a run: the scheme's shape, the model and the
    data (or the synthetic problem and its samples: dim is there already), the dtype, the seed
    (everything random in a run follows from the seed) and the optimizer (its state has a
    different shape for each)."""
    identity = {"scheme": scheme.name, "n": scheme.n, "s": scheme.s, "c": scheme.c, "dim": dim, "dtype": dtype}
    kind = {"model": model, "dataset": dataset} if problem is None else {"problem": problem, "samples": samples}
    if loss is not None:  # a run's own loss (absent from runs with the default, and from older checkpoints)
        kind["loss"] = loss
    return {**identity, **kind, "seed": seed, "optimizer": optimizer}


@dataclass(frozen=True)
class Checkpointer:
    """Writes one run's checkpoints into `directory`: its identity and configuration go into
    every file, and only the newest `keep` are kept."""

    directory: Path
    identity: dict[str, Any]
    config: dict[str, Any]
    keep: int = 3

    def save(self, step: int, params: np.ndarray, optimizer: dict[str, Any],
             encoding: np.ndarray | None = None, table=None, *,
             model_state: tuple[list[dict[str, Any]], dict[str, np.ndarray]] | None = None,
             blobs: dict[str, bytes] | None = None, name: str | None = None) -> Path:
        """Write the checkpoint of the state before `step` (see `save`)."""
        return save(self.directory, step, params, optimizer, self.identity, self.config, encoding=encoding,
                    table=table, keep=self.keep, model_state=model_state, blobs=blobs, name=name)


def save(directory: Path, step: int, params: np.ndarray, optimizer: dict[str, Any], identity: dict[str, Any],
         config: dict[str, Any], encoding: np.ndarray | None = None, table=None, keep: int = 3, *,
         model_state: tuple[list[dict[str, Any]], dict[str, np.ndarray]] | None = None,
         blobs: dict[str, bytes] | None = None, name: str | None = None) -> Path:
    """Write the checkpoint of the state before `step` and drop all but the newest `keep`; `optimizer`
    is the torch optimizer's state_dict (of the whole vector).

    `model_state`: a torch model's (layout, buffers), TorchProblem.state_layout() and
    TorchProblem.model_state(params), so that read_state_dict (pgc-export) can rebuild its
    state_dict. `blobs`: byte strings stored as they are, returned by load. `name`: write
    `<name>.h5` (e.g. "best") instead of the step's file name; such a file is not a step
    checkpoint (not listed, never pruned, and saving it prunes nothing). ValueError for a name
    that is not a plain file name or reads as a step checkpoint's."""
    directory = Path(directory)
    path = directory / (checkpoint_name(step) if name is None else _named(name))
    if model_state is not None:
        check_layout(model_state[0], path)
    directory.mkdir(parents=True, exist_ok=True)
    state = optimizer
    with atomic_h5(path, userblock=digest_block) as f:
        f.create_dataset("params", data=params)
        group = f.create_group("optimizer")
        for key, value in state["state"].get(0, {}).items():
            group.create_dataset(key, data=value.detach().cpu().numpy() if torch.is_tensor(value) else value)
        if encoding is not None:
            f.create_dataset("encoding_matrix", data=encoding)
        if table is not None:
            f.create_dataset("table/grads", data=table.grads)
            f.create_dataset("table/versions", data=table.versions)
        f.create_dataset("torch_rng", data=torch.get_rng_state().numpy())
        if model_state is not None:
            layout, buffers = model_state
            for entry in layout:
                if entry["kind"] == "buffer":
                    f.create_dataset(f"buffers/{h5_key(entry['name'])}", data=np.asarray(buffers[entry["name"]]))
            f.attrs["state_layout"] = json.dumps(layout)
        for key, blob in (blobs or {}).items():
            f.create_dataset(f"blobs/{h5_key(key)}", data=np.frombuffer(bytes(blob), dtype=np.uint8))
        f.attrs.update({"format": FORMAT, "step": step, **identity, "config": json.dumps(config),
                        "param_groups": json.dumps(state["param_groups"])})
    if name is None:
        for old in list_checkpoints(directory)[:-keep]:
            old.unlink(missing_ok=True)
    return path


def _named(name: str) -> str:
    """The file name of the checkpoint saved under `name` (ValueError for one that is not a plain
    name, or that would read as a step checkpoint's and be pruned with them)."""
    file = f"{name}.h5"
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"checkpoint name {name!r} is not a plain file name")
    if _is_step_name(file):
        raise ValueError(f"checkpoint name {name!r} reads as a step checkpoint's ({file}); choose another")
    return file


def _is_step_name(file: str) -> bool:
    """Whether a file name is a step checkpoint's, as list_checkpoints reads names."""
    try:
        checkpoint_step(Path(file))
    except ValueError:
        return False
    return True

