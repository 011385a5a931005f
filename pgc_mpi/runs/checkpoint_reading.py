"""Reading a checkpoint back, checked before anything in it is used: `load` (a checkpoint of this
run), `load_resume` (what `--resume` continues from, past damaged files), `read_state_dict`
(pgc-export's model state), and the checks every array and attribute passes.

A file is verified first (its digest: pgc_mpi.runs.checkpoint_integrity) and only then opened by
HDF5 (`_opened`); then its arrays are checked against the run (shapes, dtypes, finite values,
optimizer settings in range), so that a crafted or damaged file never broadcasts a short array
into the parameters, smuggles NaN into them or sets a learning rate the configuration would
refuse. `load_resume` skips damage: `--resume latest` (and `auto`) continues from the newest
*intact* checkpoint, warning which damaged ones it passed over (the resume then deletes them with
the rest of the abandoned continuation, and the run's outputs are cut at the step of the
checkpoint it resumes from), and fails in one line when none is intact. A checkpoint of another
run (its identity differs) is an error, never skipped; a checkpoint named by its path is used or
refused, never replaced by another.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint_integrity import CheckpointError, DamagedCheckpointError, first_line, verify
from .run_folder import list_checkpoints

FORMAT = 1  # the checkpoint format: what `save` writes and `_opened` accepts
# What h5py and NumPy raise reading a damaged file that has no digest (OSError from HDF5, KeyError
# for a lost link, ValueError/UnicodeDecodeError for garbled attributes, TypeError for garbled
# types, AttributeError for a name that now leads to a committed datatype...): one line each
# (DamagedCheckpointError), never a traceback.
_READ_ERRORS = (OSError, KeyError, ValueError, TypeError, AttributeError, RuntimeError, OverflowError,
                MemoryError)

log = logging.getLogger("pgc_mpi")


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
    model_state: tuple[list[dict[str, Any]], dict[str, np.ndarray]] | None = None  # (layout, buffers); None: none
    blobs: dict[str, bytes] = field(default_factory=dict)


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


def load_resume(spec: str, directory: Path, identity: dict[str, Any],
                encoding: np.ndarray | None = None) -> Checkpoint:
    """The checkpoint a `--resume spec` run continues from (`load`).

    `latest`: the newest intact checkpoint in `directory`. A damaged one (DamagedCheckpointError:
    unreadable, incomplete, its digest wrong) is skipped for the one before it, with a warning
    naming the damaged file(s) and the checkpoint resumed from; the caller must then cut the run's
    outputs at the returned checkpoint's step (its `step`, not the newest file's). Anything else
    (a checkpoint of another run: a CheckpointError) is raised as it is, as is damage when no
    intact checkpoint is left. A path: that file only (a damaged one is an error, not replaced)."""
    if spec != "latest":
        return load(resolve(spec, directory), identity, encoding)
    found = list_checkpoints(directory)
    if not found:
        raise CheckpointError(f"--resume latest: no checkpoint in {directory}")
    damaged: list[Path] = []
    for path in reversed(found):
        try:
            resumed = load(path, identity, encoding)
        except DamagedCheckpointError as exc:
            log.warning("resume: %s", " ".join(str(exc).split()))
            damaged.append(path)
            continue
        if damaged:
            log.warning("resume: resuming from %s (step %d), the newest intact checkpoint, instead of the damaged "
                        "%s; the steps after %d are trained again, and the damaged file%s deleted with the rest "
                        "of the abandoned continuation", path, resumed.step, ", ".join(p.name for p in damaged),
                        resumed.step, " is" if len(damaged) == 1 else "s are")
        return resumed
    raise DamagedCheckpointError(f"--resume latest: every checkpoint in {directory} is damaged "
                                 f"({', '.join(p.name for p in damaged)}), none is left to resume from; start the run "
                                 f"afresh (--overwrite) or restore a checkpoint from a copy")


def load(path: Path, identity: dict[str, Any], encoding: np.ndarray | None = None) -> Checkpoint:
    """Read a checkpoint and check that it belongs to a run of this shape (`identity`).

    The number of workers n may differ (an elastic restart on the workers that are left, or on
    more): the run's placement and encoding matrix are then its own, built for its n, the
    partitions are re-split n ways, and pbs's table, whose rows are the old partitions, is not
    restored (it fills again as at a start); parameters, optimizer state, step and RNG carry over.
    The Checkpoint says so (`workers_before`)."""
    with _opened(path) as f:
        try:
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
            raise DamagedCheckpointError(f"{path}: incomplete checkpoint (missing {exc}); use an earlier one") from None
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
        raise DamagedCheckpointError(f"{path}: its step attribute {step!r} is not a non-negative integer; "
                              f"use another checkpoint")
    table = "table" in f
    n = identity.get("n")
    rng = _array(f, "torch_rng", path, tuple(torch.get_rng_state().shape), "uint8")
    optimizer = {"state": {0: state} if state else {}, "param_groups": groups}
    return Checkpoint(
        path=path, step=int(step), params=params, optimizer=optimizer,
        table_grads=_array(f, "table/grads", path, (n, dim) if n is not None else None, dtype) if table else None,
        table_versions=_array(f, "table/versions", path, (n,) if n is not None else None, "int64") if table else None,
        rng=torch.from_numpy(rng), model_state=_read_model_state(f, path, len(params)), blobs=_read_blobs(f, path),
    )


def _read_model_state(f, path: Path, dim: int) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]] | None:
    """The checkpoint's (layout, buffers), checked: the layout's parameters tile the `dim`
    parameters, each buffer has its layout's shape and dtype. None when it holds no layout."""
    if "state_layout" not in f.attrs:
        return None
    try:
        layout = json.loads(f.attrs["state_layout"])
    except (TypeError, ValueError):
        layout = None
    layout = check_layout(layout, path)
    spans = sorted({(e["offset"], math.prod(e["shape"])) for e in layout if e["kind"] == "param"})
    end = 0
    for offset, size in spans:
        if offset != end:
            break
        end += size
    if end != dim or len({offset for offset, _ in spans}) != len(spans):
        raise DamagedCheckpointError(f"{path}: its model layout does not fit its {dim} parameters; the checkpoint is "
                              f"damaged; use another one")
    buffers = {}
    for e in layout:
        if e["kind"] == "buffer":
            key = f"buffers/{h5_key(e['name'])}"
            if key not in f:
                raise DamagedCheckpointError(f"{path}: incomplete checkpoint (missing buffer {e['name']!r}); "
                                      f"use another one")
            buffers[e["name"]] = _array(f, key, path, tuple(e["shape"]), _numpy_dtype(e["dtype"], path))
    return layout, buffers


def _numpy_dtype(name: str, path: Path) -> str:
    """The NumPy dtype a buffer of this torch dtype is stored as."""
    try:
        return str(torch.empty(0, dtype=getattr(torch, name)).numpy().dtype)
    except (TypeError, RuntimeError):
        raise DamagedCheckpointError(f"{path}: its model layout names dtype {name!r}, which a checkpoint cannot "
                              f"hold; the checkpoint is damaged") from None


def _read_blobs(f, path: Path) -> dict[str, bytes]:
    """The checkpoint's byte strings by name (empty when it has none)."""
    if "blobs" not in f:
        return {}
    blobs = {}
    for key, data in f["blobs"].items():
        if not hasattr(data, "dtype") or data.dtype != np.uint8 or data.ndim != 1:
            raise DamagedCheckpointError(f"{path}: blob {key!r} is not a byte string; the checkpoint is damaged")
        blobs[key.replace("%2F", "/").replace("%25", "%")] = data[...].tobytes()
    return blobs


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The model's state_dict stored in checkpoint `path` (CPU tensors, ordered like its layout):
    the parameters sliced from `params` by the layout, the buffers from `buffers/`. What
    `module.load_state_dict` of a module of the model's class accepts (pgc-export writes it).
    CheckpointError (one line) for an unreadable or damaged file, and for a checkpoint that holds
    no model layout (a synthetic --problem run, or a file written before layouts were stored)."""
    from ..learning.state import assemble_state_dict

    path = Path(path)
    with _opened(path) as f:
        try:
            if "state_layout" not in f.attrs:
                raise CheckpointError(f"{path}: the checkpoint holds no model layout (a synthetic --problem run, "
                                      f"or a checkpoint written before layouts were stored): no state_dict to "
                                      f"rebuild")
            if f["params"].ndim != 1:
                raise DamagedCheckpointError(f"{path}: params is not a vector; the checkpoint is damaged")
            params = _array(f, "params", path, None, None)
            layout, buffers = _read_model_state(f, path, len(params))
        except (KeyError, TypeError, ValueError) as exc:
            raise DamagedCheckpointError(f"{path}: incomplete or damaged checkpoint ({first_line(exc)}); "
                                         f"use another one") from None
    try:
        return assemble_state_dict(layout, params, buffers)
    except ValueError as exc:
        raise CheckpointError(f"{path}: its model state does not fit together ({exc}); use another one") from None


@contextmanager
def _opened(path: Path) -> Iterator[Any]:
    """The checkpoint file open for reading, its digest verified first (when it has one: see
    `verify`) and its format checked, before the caller reads anything. Whatever reading the file
    raises, here or in the caller's block, is one line: CheckpointError, DamagedCheckpointError
    for h5py's and NumPy's errors on a damaged file."""
    import h5py

    verify(path)  # before HDF5 parses a byte: a damaged file can crash the HDF5 library itself
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise DamagedCheckpointError(f"{path}: not a readable checkpoint ({first_line(exc)}); the file is "
                                     f"damaged or not a checkpoint; use an earlier one") from None
    try:
        with f:
            found = f.attrs.get("format")
            if found is None or int(found) != FORMAT:
                raise DamagedCheckpointError(f"{path}: checkpoint format {found} is not {FORMAT}; the file is damaged "
                                             f"or of another version")
            yield f
    except CheckpointError:
        raise
    except _READ_ERRORS as exc:
        raise DamagedCheckpointError(f"{path}: the checkpoint is damaged ({type(exc).__name__}: {first_line(exc)} "
                                     f"reading it); use an earlier one") from None


def _array(f, name: str, path: Path, shape: tuple | None, dtype: str | None) -> np.ndarray:
    """Dataset `name`, refused unless it has this shape (None: any) and dtype (None: any float) and is finite."""
    data = f[name]
    if shape is not None and tuple(data.shape) != tuple(shape):
        raise DamagedCheckpointError(f"{path}: {name} has shape {tuple(data.shape)}, this run needs {tuple(shape)}; "
                              f"the checkpoint is damaged or from another run")
    want = np.dtype(dtype) if dtype is not None else None
    if (want is not None and data.dtype != want) or (want is None and data.dtype.kind != "f"):
        raise DamagedCheckpointError(f"{path}: {name} is {data.dtype}, this run needs {want or 'floats'}; "
                              f"the checkpoint is damaged or from another run")
    values = data[...]
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise DamagedCheckpointError(f"{path}: {name} contains NaN or Inf; resume from an earlier checkpoint")
    return values


def _param_groups(text: Any, path: Path) -> list[dict[str, Any]]:
    """The optimizer's hyper-parameters: one group (a built-in's) or several (a user's optimizer's
    param groups), each with numbers that are finite and in range."""
    try:
        groups = json.loads(text)
    except (TypeError, ValueError):
        groups = None
    ok = isinstance(groups, list) and len(groups) >= 1 and all(isinstance(g, dict) for g in groups)
    for group in groups if ok else []:
        lr, momentum = group.get("lr"), group.get("momentum", 0.0)
        ok = ok and all(isinstance(v, (int, float)) and math.isfinite(v) for v in (lr, momentum)) and lr > 0 and \
            0 <= momentum < 1
    if not ok:
        raise DamagedCheckpointError(f"{path}: its optimizer settings (param_groups) are damaged or out of range; "
                              f"use another checkpoint")
    return groups


def check_layout(layout: Any, path: Path) -> list[dict[str, Any]]:
    """A state layout as TorchProblem.state_layout writes it, or CheckpointError."""
    ok = isinstance(layout, list) and all(
        isinstance(e, dict) and isinstance(e.get("name"), str) and e.get("kind") in ("param", "buffer")
        and isinstance(e.get("shape"), list) and all(isinstance(d, int) and d >= 0 for d in e["shape"])
        and isinstance(e.get("dtype"), str) and isinstance(getattr(torch, e["dtype"], None), torch.dtype)
        and (e["kind"] == "buffer" or (isinstance(e.get("offset"), int) and e["offset"] >= 0))
        for e in layout)
    if not ok or len({e["name"] for e in layout}) != len(layout):
        raise DamagedCheckpointError(f"{path}: its model layout (state_layout) is damaged; use another checkpoint")
    return layout


def h5_key(name: str) -> str:
    """A state_dict or blob name as an HDF5 dataset name ('/' would make groups: escaped as %2F)."""
    return name.replace("%", "%25").replace("/", "%2F")

