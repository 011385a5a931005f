"""A torch model's state_dict from the master's flat parameter vector, and back out of a checkpoint.

The master holds only the flat parameter vector (FlatParams: the parameters of
`module.parameters()`, in that order, one after the other). A state_dict also holds the buffers
(batch-norm running statistics, num_batches_tracked, ...), which never travel: the master
computes them before each evaluation (TorchProblem._recalibrate). A layout says how the two make
the state_dict: one entry per state_dict entry, in its order,

    {"name": "1.weight", "kind": "param", "shape": [16, 64], "dtype": "float32", "offset": 0}
    {"name": "2.running_mean", "kind": "buffer", "shape": [16], "dtype": "float32"}

a parameter (found by identity among module.parameters()) with "offset", where its elements start
in the flat vector; anything else is a buffer. Tied parameters (one nn.Parameter under several
names, e.g. a decoder sharing its encoder's weight): module.parameters() lists it once, so it is
in the flat vector once; the layout lists it under each of its state_dict names, with one offset,
and the rebuilt state_dict has one tensor under those names (torch.save keeps them one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError


def layout_of(module: nn.Module) -> list[dict[str, Any]]:
    """The layout of `module`'s state_dict (see the module doc). ConfigError for a module whose
    state_dict holds something other than tensors (get_extra_state): it cannot be exported."""
    offsets, offset = {}, 0
    for p in module.parameters():
        offsets[id(p)] = offset
        offset += p.numel()
    layout = []
    for name, value in module.state_dict(keep_vars=True).items():
        if not isinstance(value, torch.Tensor):
            raise ConfigError(f"the model's state_dict entry {name!r} is a {type(value).__name__}, not a tensor: "
                              f"a model with extra state cannot be exported")
        entry: dict[str, Any] = {"name": name, "kind": "buffer", "shape": list(value.shape),
                                 "dtype": str(value.dtype).removeprefix("torch.")}
        if id(value) in offsets:
            entry.update(kind="param", offset=offsets[id(value)])
        layout.append(entry)
    return layout


def buffers_of(module: nn.Module, layout: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Copies of `module`'s buffers named in `layout`, in its order (empty when it names none)."""
    names = [e["name"] for e in layout if e["kind"] == "buffer"]
    if not names:
        return {}
    state = module.state_dict()
    return {name: state[name].detach().cpu().numpy().copy() for name in names}


def model_state(problem: Any, w: np.ndarray) -> dict[str, np.ndarray]:
    """TorchProblem.model_state: the buffers at `w` as evaluate() computes them, torch's random
    state left as it was (the calibration's forward passes draw from a copy of it)."""
    problem.set_params(w)
    layout = layout_of(problem.module)
    if problem.has_buffers and any(e["kind"] == "buffer" for e in layout):
        device = problem.device
        cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            problem._recalibrate()  # exactly what evaluate() runs before it evaluates
    return buffers_of(problem.module, layout)


def assemble_state_dict(layout: list[dict[str, Any]], params: np.ndarray,
                        buffers: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """A module's state_dict (CPU tensors, in the layout's order) from its layout, its flat
    parameter vector and its buffers by name; the names of a tied parameter share one tensor.
    ValueError when they do not fit together."""
    out: dict[str, torch.Tensor] = {}
    by_offset: dict[int, torch.Tensor] = {}
    for entry in layout:
        name, shape, dtype = entry["name"], tuple(entry["shape"]), getattr(torch, entry["dtype"])
        if entry["kind"] == "param":
            offset, size = int(entry["offset"]), int(np.prod(shape, dtype=np.int64))
            if offset < 0 or offset + size > len(params):
                raise ValueError(f"parameter {name} (elements {offset}..{offset + size}) lies outside the "
                                 f"{len(params)} parameters")
            if offset not in by_offset:
                by_offset[offset] = torch.from_numpy(np.array(params[offset:offset + size])).reshape(shape).to(dtype)
            out[name] = by_offset[offset]
            continue
        if name not in buffers:
            raise ValueError(f"buffer {name} is missing")
        value = np.asarray(buffers[name])
        if tuple(value.shape) != shape:
            raise ValueError(f"buffer {name} has shape {list(value.shape)}, its layout says {list(shape)}")
        out[name] = torch.from_numpy(value.copy()).to(dtype)
    return out
