"""Checkpoints: the master's training state in one HDF5 file, written atomically.

A checkpoint `ckpt-00001200.h5` holds everything the master needs to go on from step 1200:
  params                    the flat parameters after 1199 steps (float32 or float64)
  optimizer/<key>           the torch optimizer's per-parameter state (momentum, Adam moments...)
  encoding_matrix           the scheme's B (coded schemes), checked on resume
  table/grads, versions     pbs's partition table
  attributes                format, step, scheme, n, s, c, dim, dtype, model and dataset (or
                            a synthetic problem and its samples), the
                            configuration (JSON), the optimizer's param groups (JSON), the master's
                            torch RNG state, the straggler model's spec and seed.
Everything random in a run is a pure function of (seed, step, worker, ...) - minibatches, delays,
gc-cr's B - so the seed and the step are the whole RNG state; the torch RNG is stored as well.
Workers' stale buffers are not stored: after a resume every pipelined worker rebuilds them by a
warm-up at the resumed model (see CodedScheme.warmup_versions).

Written to a temporary name, flushed, fsynced and renamed, so a crash mid-write never leaves a
file under a checkpoint's name; the last `keep` checkpoints are kept.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import PgcError
from ..learning.h5format import atomic_h5
from .run_folder import checkpoint_name, list_checkpoints

FORMAT = 1


class CheckpointError(PgcError):
    """A checkpoint that is missing, corrupt, or from another run shape."""


@dataclass
class Checkpoint:
    """What a checkpoint restores."""

    path: Path
    step: int
    params: np.ndarray
    optimizer: dict[str, Any]
    table_grads: np.ndarray | None
    table_versions: np.ndarray | None
    rng: torch.Tensor
    workers_before: int | None = None  # the checkpoint's n, when this run has another (elastic)


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
             encoding: np.ndarray | None = None, table=None) -> Path:
        """Write the checkpoint of the state before `step` (see `save`)."""
        return save(self.directory, step, params, optimizer, self.identity, self.config, encoding=encoding,
                    table=table, keep=self.keep)


def save(directory: Path, step: int, params: np.ndarray, optimizer: dict[str, Any], identity: dict[str, Any],
         config: dict[str, Any], encoding: np.ndarray | None = None, table=None, keep: int = 3) -> Path:
    """Write the checkpoint of the state before `step` and drop all but the newest `keep`; `optimizer`
    is the torch optimizer's state_dict (of the whole vector)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / checkpoint_name(step)
    state = optimizer
    with atomic_h5(path) as f:
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
        f.attrs.update({"format": FORMAT, "step": step, **identity, "config": json.dumps(config),
                        "param_groups": json.dumps(state["param_groups"])})
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def resolve(spec: str, directory: Path) -> Path:
    """`latest` (the newest in `directory`) or a path."""
    if spec == "latest":
        found = list_checkpoints(directory)
        if not found:
            raise CheckpointError(f"--resume latest: no checkpoint in {directory}")
        return found[-1]
    path = Path(spec)
    if not path.is_file():
        raise CheckpointError(f"--resume {spec}: no such checkpoint file")
    return path


def load(path: Path, identity: dict[str, Any], encoding: np.ndarray | None = None) -> Checkpoint:
    """Read a checkpoint and check that it belongs to a run of this shape (`identity`).

    The number of workers n may differ (an elastic restart on the workers that are left, or on
    more): the run's placement and encoding matrix are then its own, built for its n, the
    partitions are re-split n ways, and pbs's table, whose rows are the old partitions, is not
    restored (it fills again as at a start); parameters, optimizer state, step and RNG carry over.
    The Checkpoint says so (`workers_before`)."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint ({exc})") from None
    with f:
        try:
            if int(f.attrs["format"]) != FORMAT:
                raise CheckpointError(f"{path}: checkpoint format {f.attrs['format']} is not {FORMAT}")
            theirs_n = f.attrs["n"].item() if "n" in f.attrs and hasattr(f.attrs["n"], "item") else f.attrs.get("n")
            elastic = "n" in identity and theirs_n is not None and theirs_n != identity["n"]
            if elastic:
                identity, encoding = {**identity, "n": int(theirs_n)}, None
            for key, want in identity.items():
                if key not in f.attrs:  # model and dataset, or problem: a run of the other kind
                    raise CheckpointError(f"{path}: the checkpoint has no {key}: it is for another kind of run "
                                          f"(a torch model, or a synthetic --problem); start a new run")
                got = f.attrs[key]
                got = got.item() if hasattr(got, "item") else got
                if got != want:
                    raise CheckpointError(f"{path}: the checkpoint is for {key} = {got!r}, this run has {want!r}; "
                                          f"resume with the same {key} or start a new run")
            if encoding is not None and not np.array_equal(f["encoding_matrix"][...], encoding):
                raise CheckpointError(f"{path}: its encoding matrix differs from this run's (other seed?)")
            found = _read_checked(f, Path(path), identity)
        except KeyError as exc:
            raise CheckpointError(f"{path}: incomplete checkpoint (missing {exc}); use an earlier one") from None
    if elastic:
        found.workers_before, found.table_grads, found.table_versions = int(theirs_n), None, None
    return found


def _read_checked(f, path: Path, identity: dict[str, Any]) -> Checkpoint:
    """Every array and scalar of an open checkpoint, checked against the run before anything is
    loaded: a crafted or damaged file must not broadcast a short array into the parameters,
    smuggle NaN into them, or set a learning rate the configuration would refuse."""
    dim, dtype = identity.get("dim"), identity.get("dtype")
    params = _array(f, "params", path, (dim,) if dim is not None else None, dtype)
    state = {key: torch.from_numpy(_array(f, f"optimizer/{key}", path, (dim,) if key != "step" else (),
                                          dtype if key != "step" else None)) for key in f["optimizer"]}
    groups = _param_groups(f.attrs["param_groups"], path)
    step = f.attrs["step"]
    if not isinstance(step, (int, np.integer)) or step < 0:
        raise CheckpointError(f"{path}: its step attribute {step!r} is not a non-negative integer; "
                              f"use another checkpoint")
    table = "table" in f
    n = identity.get("n")
    rng = _array(f, "torch_rng", path, tuple(torch.get_rng_state().shape), "uint8")
    optimizer = {"state": {0: state} if state else {}, "param_groups": groups}
    return Checkpoint(
        path=path, step=int(step), params=params, optimizer=optimizer,
        table_grads=_array(f, "table/grads", path, (n, dim) if n is not None else None, dtype) if table else None,
        table_versions=_array(f, "table/versions", path, (n,) if n is not None else None, "int64") if table else None,
        rng=torch.from_numpy(rng),
    )


def _array(f, name: str, path: Path, shape: tuple | None, dtype: str | None) -> np.ndarray:
    """Dataset `name`, refused unless it has this shape (None: any) and dtype (None: any float) and is finite."""
    data = f[name]
    if shape is not None and tuple(data.shape) != tuple(shape):
        raise CheckpointError(f"{path}: {name} has shape {tuple(data.shape)}, this run needs {tuple(shape)}; "
                              f"the checkpoint is damaged or from another run")
    want = np.dtype(dtype) if dtype is not None else None
    if (want is not None and data.dtype != want) or (want is None and data.dtype.kind != "f"):
        raise CheckpointError(f"{path}: {name} is {data.dtype}, this run needs {want or 'floats'}; "
                              f"the checkpoint is damaged or from another run")
    values = data[...]
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise CheckpointError(f"{path}: {name} contains NaN or Inf; resume from an earlier checkpoint")
    return values


def _param_groups(text: Any, path: Path) -> list[dict[str, Any]]:
    """The optimizer's hyper-parameters: one group whose numbers are finite and in range."""
    try:
        groups = json.loads(text)
    except (TypeError, ValueError):
        groups = None
    ok = isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict)
    if ok:
        lr, momentum = groups[0].get("lr"), groups[0].get("momentum", 0.0)
        ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (lr, momentum)) and lr > 0 and \
            0 <= momentum < 1
    if not ok:
        raise CheckpointError(f"{path}: its optimizer settings (param_groups) are damaged or out of range; "
                              f"use another checkpoint")
    return groups
