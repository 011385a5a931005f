"""A fingerprint of a run's data: the same on every rank exactly when the ranks hold the same data.

Exact decoding assumes that every holder of a partition computes its gradient on the same rows.
A script that draws its data without a seed (`np.random.default_rng()`) gives every rank other
data, and the decoded gradient is then silently wrong; a resume on other data silently continues
another run. Both are caught by comparing fingerprints (pgc_mpi.job.checks.same_data across
ranks, pgc_mpi.runs.run_folder.check_same_data against config.json).

- arrays (NumPy, torch tensors, `(x, y)` pairs of them): a hash of every byte, with each array's
  shape and dtype. A torch tensor and the NumPy array of the same values have the same fingerprint.
- a map-style torch Dataset: its length and a hash of SAMPLE_ITEMS items at indices drawn by a
  fixed-seed generator (the same on every rank), read with the random generators seeded, so that a
  random transform draws the same everywhere: the fingerprint is the data's, not the augmentation's
  (pgc_mpi.learning.torch_problem seeds torch's generator before each minibatch for the same reason).
  Reading every item could take as long as an epoch: a sample catches the unseeded data sets,
  which differ almost everywhere.

Every function is deterministic and imports torch only when given a torch object.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError

# Items of a Dataset hashed (all of them when it has fewer)
SAMPLE_ITEMS = 32
# The seed of the sampled indices and of the random generators while they are read: fixed, so that every
# rank (and every later run) reads the same items the same way
SAMPLE_SEED = 0x5EED
PREFIX = "blake2b:"


def _hasher() -> Any:
    # 128 bits: no accidental collision between data sets, and short enough to read in config.json
    return hashlib.blake2b(digest_size=16)


def _torch_array(tensor: Any) -> tuple[np.ndarray, str]:
    """A tensor's values as a NumPy array, and its dtype's name; a dtype NumPy lacks (bfloat16) as its raw
    bytes under torch's name."""
    import torch

    tensor = tensor.detach().cpu().contiguous()
    try:
        values = tensor.numpy()
    except TypeError:  # bfloat16 and the like: the bits are the data
        return tensor.reshape(-1).view(torch.uint8).numpy().reshape(*tensor.shape, -1), str(tensor.dtype)
    return values, values.dtype.str


def _update_array(h: Any, value: Any) -> None:
    """Feed one array (NumPy, torch or array-like) into `h`: its dtype, shape and bytes."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        values, dtype = _torch_array(value)
    else:
        values = np.asarray(value)
        dtype = values.dtype.str
    if values.dtype == object:  # no bytes to hash (not numbers): only its kind, so never a false difference
        h.update(f"object{values.shape}".encode())
        return
    h.update(f"{dtype}{values.shape}".encode())
    # the array's own buffer where it is contiguous, no copy of a large array
    h.update(memoryview(np.ascontiguousarray(values).reshape(-1).view(np.uint8)))


def _update_item(h: Any, item: Any) -> None:
    """Feed one Dataset item into `h`: tuples, lists and dicts element by element, text as text, anything
    else as an array (a tensor, a NumPy array, a number, a PIL image)."""
    if isinstance(item, (tuple, list)):
        h.update(f"({len(item)}".encode())
        for part in item:
            _update_item(h, part)
        h.update(b")")
    elif isinstance(item, Mapping):
        h.update(f"{{{len(item)}".encode())
        for key in sorted(item, key=str):
            h.update(str(key).encode())
            _update_item(h, item[key])
        h.update(b"}")
    elif isinstance(item, (str, bytes)):
        h.update(item.encode() if isinstance(item, str) else item)
    else:
        _update_array(h, item)


def arrays_fingerprint(data: Any) -> str:
    """The fingerprint of an array or of a tuple/list of arrays (an `(x, y)` pair): every byte, shape and dtype."""
    h = _hasher()
    _update_item(h, data if isinstance(data, (tuple, list)) else (data,))
    return PREFIX + h.hexdigest()


def sample_indices(length: int, count: int = SAMPLE_ITEMS) -> np.ndarray:
    """The indices of a Dataset of `length` items that its fingerprint reads: `count` of them (all when
    fewer), drawn without replacement by a fixed-seed generator, sorted."""
    if length <= count:
        return np.arange(length)
    return np.sort(np.random.default_rng(SAMPLE_SEED).choice(length, size=count, replace=False))


def dataset_fingerprint(dataset: Any, what: str = "train_data") -> str:
    """The fingerprint of a map-style Dataset (`__len__`, `__getitem__`): its length and its sampled items
    (sample_indices), read with torch's, NumPy's global and Python's generators seeded by SAMPLE_SEED
    (their states are restored after), so that a random transform draws the same on every rank and the
    fingerprint is the data's. A failing `__getitem__` is a ConfigError naming `what` and the index."""
    import torch

    length = len(dataset)
    h = _hasher()
    h.update(f"dataset{length}".encode())
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SAMPLE_SEED)
            np.random.seed(SAMPLE_SEED)  # the global generators a transform may draw from too
            random.seed(SAMPLE_SEED)
            for index in sample_indices(length).tolist():
                try:
                    item = dataset[index]
                except Exception as exc:  # noqa: BLE001 - the user's __getitem__ or transform
                    text = str(exc).strip().splitlines()
                    raise ConfigError(f"{what}: reading sample {index} failed: {type(exc).__name__}: "
                                      f"{text[0] if text else ''}") from None
                h.update(f"[{index}]".encode())
                _update_item(h, item)
    finally:
        np.random.set_state(numpy_state)  # the caller's draws go on as if nothing was read
        random.setstate(python_state)
    return PREFIX + h.hexdigest()


def data_fingerprint(data: Any, what: str = "train_data") -> str:
    """The fingerprint of data as pgc_mpi.fit takes it: `(x, y)` arrays (NumPy or torch) or one array, or a
    map-style torch Dataset (`what` names it in the error of a failing `__getitem__`)."""
    torch = sys.modules.get("torch")
    arrays = isinstance(data, (tuple, list, np.ndarray)) or (torch is not None and isinstance(data, torch.Tensor))
    if arrays or not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        return arrays_fingerprint(data)
    return dataset_fingerprint(data, what)


def problem_fingerprint(problem: Any) -> dict[str, str | None] | None:
    """{"train": ..., "test": ... (None without test data)} of a problem's data source, computed once per
    source, and "partitioning" (--partitioning) where the problem's partitions are cut by class (an iid
    split adds nothing: the fingerprints of runs before --partitioning stay valid); None where there is
    nothing to compare: a synthetic problem (drawn from the seed), an HDF5 file (its checksum and content
    are checked on every rank when it is opened: h5check), no problem (a server other than rank 0)."""
    found = _source_fingerprint(problem)
    partitioning = getattr(problem, "partitioning", "iid") if found is not None else "iid"
    return found if partitioning == "iid" else {**found, "partitioning": partitioning}


def _source_fingerprint(problem: Any) -> dict[str, str | None] | None:
    source = getattr(problem, "source", None) if problem is not None else None
    compute = getattr(source, "fingerprint", None)
    if compute is None:
        return None
    cached = getattr(source, "_fingerprint", None)
    if cached is None:
        cached = compute()
        source._fingerprint = cached  # reading a Dataset's sample twice on rank 0 would be wasted time
    return cached


def describe(fingerprint: str | None) -> str:
    """A fingerprint shortened for a message (its first 12 hex digits), 'none' for None."""
    return "none" if fingerprint is None else fingerprint.removeprefix(PREFIX)[:12]
