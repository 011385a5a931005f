"""Checkpoints: the master's training state in one HDF5 file, written atomically.

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

Integrity: every checkpoint begins with a 512-byte HDF5 user block (which HDF5 reserves for its
users and skips) holding, as text, the SHA-256 and the length of the HDF5 file after it: every
dataset (parameters, optimizer state, buffers...), every attribute and the HDF5 structure itself.
Reading a checkpoint (`load`, `read_state_dict`, anything through `_opened`) verifies it first, on
the file's plain bytes (`verify`), so a flipped bit anywhere, a file cut short or changed after it
was written is refused before a number is used, and before HDF5 parses it: HDF5 can crash
(SIGSEGV) on some damaged files. The cost: one more read of the file (SHA-256 runs at ~2 GB/s).
Then the arrays are checked against the run (shapes, dtypes, finite values, optimizer settings in
range). A file without the block (it begins with HDF5's own signature), written before digests
were stored, is still accepted: it gets those checks only. A file beginning with neither is
damaged. Every failure is one line: CheckpointError; for damage (unreadable, incomplete, a wrong
digest, contents that do not fit together, whatever h5py raises reading it) its subclass
DamagedCheckpointError. `load_resume` skips damage: `--resume latest` (and `auto`) continues from
the newest *intact* checkpoint, warning which damaged ones it passed over (the resume then deletes
them with the rest of the abandoned continuation, and the run's outputs are cut at the step of the
checkpoint it resumes from), and fails in one line when none is intact. A checkpoint of another run
(its identity differs) is an error, never skipped; a checkpoint named by its path is used or
refused, never replaced by another. A file edited on purpose (h5py "r+") fails the digest until
`seal` writes a new one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import PgcError
from ..learning.h5format import USERBLOCK, atomic_h5
from .run_folder import checkpoint_name, checkpoint_step, list_checkpoints

FORMAT = 1
# The digest lives in the file's HDF5 user block, the first USERBLOCK bytes, which HDF5 reserves for
# its users and skips: it can be checked on the file's plain bytes before HDF5 parses any of them.
_MAGIC = b"pgc-mpi checkpoint v1\n"
_BLOCK = re.compile(rb"pgc-mpi checkpoint v1\nsha256 ([0-9a-f]{64})\nbytes ([0-9]{1,20})\n\0*")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # where a file without a user block (an older checkpoint) begins
_HASH_BLOCK = 16 << 20  # bytes hashed at a time: memory stays bounded for any checkpoint
# What h5py and NumPy raise reading a damaged file that has no digest (OSError from HDF5, KeyError
# for a lost link, ValueError/UnicodeDecodeError for garbled attributes, TypeError for garbled
# types, AttributeError for a name that now leads to a committed datatype...): one line each
# (DamagedCheckpointError), never a traceback.
_READ_ERRORS = (OSError, KeyError, ValueError, TypeError, AttributeError, RuntimeError, OverflowError,
                MemoryError)

log = logging.getLogger("pgc_mpi")


class CheckpointError(PgcError):
    """A checkpoint that is missing, corrupt, or from another run shape."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint whose contents cannot be trusted: unreadable, incomplete, its digest wrong, or
    its arrays inconsistent with one another. `load_resume` falls back past such a file to an
    earlier one; a checkpoint of another run is a plain CheckpointError and never falls back."""


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
        _check_layout(model_state[0], path)
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
                    f.create_dataset(f"buffers/{_h5_key(entry['name'])}", data=np.asarray(buffers[entry["name"]]))
            f.attrs["state_layout"] = json.dumps(layout)
        for key, blob in (blobs or {}).items():
            f.create_dataset(f"blobs/{_h5_key(key)}", data=np.frombuffer(bytes(blob), dtype=np.uint8))
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


def _h5_key(name: str) -> str:
    """A state_dict or blob name as an HDF5 dataset name ('/' would make groups: escaped as %2F)."""
    return name.replace("%", "%25").replace("/", "%2F")


def _check_layout(layout: Any, path: Path) -> list[dict[str, Any]]:
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
    layout = _check_layout(layout, path)
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
            key = f"buffers/{_h5_key(e['name'])}"
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
            raise DamagedCheckpointError(f"{path}: incomplete or damaged checkpoint ({_first_line(exc)}); "
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
        raise DamagedCheckpointError(f"{path}: not a readable checkpoint ({_first_line(exc)}); the file is "
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
        raise DamagedCheckpointError(f"{path}: the checkpoint is damaged ({type(exc).__name__}: {_first_line(exc)} "
                                     f"reading it); use an earlier one") from None


def digest_block(image: bytes | memoryview) -> bytes:
    """The user block written before a checkpoint's HDF5 image: the SHA-256 and the length of the
    image, as text, zero-padded to USERBLOCK bytes (HDF5 skips it, `head -c 512` shows it)."""
    text = _MAGIC + f"sha256 {hashlib.sha256(image).hexdigest()}\nbytes {len(image)}\n".encode()
    return text.ljust(USERBLOCK, b"\0")


def verify(path: Path) -> bool:
    """Check a checkpoint's bytes against the digest in its user block, reading the file as plain
    bytes (HDF5 never sees a damaged file). True when verified; False for a file written before
    digests were stored (it begins with HDF5's signature itself), which is accepted as it is.
    DamagedCheckpointError for a file cut short, changed, or beginning with neither."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            head = fh.read(USERBLOCK)
            if head.startswith(_HDF5_SIGNATURE):
                return False  # written before digests: the structural checks of `load` only
            if not head.startswith(_MAGIC):
                raise DamagedCheckpointError(f"{path}: not a readable checkpoint (it begins with neither a pgc-mpi "
                                             f"checkpoint's digest block nor HDF5's signature); the file is damaged "
                                             f"or not a checkpoint; use an earlier one")
            if len(head) < USERBLOCK:
                raise DamagedCheckpointError(f"{path}: damaged or incomplete checkpoint (cut short: {len(head)} "
                                             f"bytes); use an earlier one")
            match = _BLOCK.fullmatch(head)
            if match is None:
                raise DamagedCheckpointError(f"{path}: the checkpoint is damaged (its digest block is garbled); use "
                                             f"an earlier one")
            want, length = match.group(1).decode(), int(match.group(2))
            h, read = hashlib.sha256(), 0
            while chunk := fh.read(_HASH_BLOCK):
                h.update(chunk)
                read += len(chunk)
    except OSError as exc:
        raise DamagedCheckpointError(f"{path}: not a readable checkpoint ({_first_line(exc)}); use an earlier "
                                     f"one") from None
    if read != length:
        raise DamagedCheckpointError(f"{path}: damaged or incomplete checkpoint ({read} bytes after its digest block, "
                                     f"{length} written: cut short or appended to); use an earlier one")
    if h.hexdigest() != want:
        raise DamagedCheckpointError(f"{path}: damaged or incomplete checkpoint (its bytes do not match the digest "
                                     f"written with it: a flipped bit, a bad copy, or a change after it was "
                                     f"written); use an earlier checkpoint")
    return True


def seal(path: Path) -> Path:
    """Write a fresh digest block for checkpoint `path` as it now is: for a file changed on purpose
    (tests of the structural checks edit one with h5py), never for one that failed `verify` by
    accident. Not atomic: the file is rewritten in place."""
    path = Path(path)
    data = path.read_bytes()
    image = memoryview(data)[USERBLOCK:] if data.startswith(_MAGIC) else memoryview(data)
    with path.open("wb") as fh:
        fh.write(digest_block(image))
        fh.write(image)
    return path


def _first_line(exc: BaseException) -> str:
    """An exception's message on one line (h5py's can span several)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
