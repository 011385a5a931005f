"""The number format gradient messages travel in (pgc-train --wire-dtype).

Workers compute and combine gradients in the run's dtype (--dtype) and round the coded message
to the wire format just before it is sent; the master widens every message back as it takes it
in and accumulates, decodes and updates in the run's dtype. Models travel in the run's dtype:
rounding the parameters to bfloat16's 8 significant bits would lose every update smaller than
1/256 of a weight, and the master's inbound traffic, which grows with N, is the gradients.

NumPy has float16 but no bfloat16: bfloat16 travels as the upper 16 bits of the float32 number
(rounded to nearest, ties to even, as torch rounds), stored in uint16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WIRE_DTYPES = ("float32", "bfloat16", "float16")
FLOAT16_MAX = float(np.finfo(np.float16).max)
# Unit roundoff of each format rounded to nearest: half the gap between 1 and the next number.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
# A step whose estimated rounding error (decode_error) is above this is worth a warning.
DECODE_ERROR_WARNING = 0.05


@dataclass(frozen=True)
class WireFormat:
    """How a run's gradient messages are stored on the wire: `name` (a WIRE_DTYPES entry or the
    run's dtype), the NumPy dtype that holds them, and the run's dtype they are widened to."""

    name: str
    storage: np.dtype
    compute: np.dtype

    @property
    def narrowed(self) -> bool:
        """Whether messages are rounded on the way (the wire format is not the run's dtype)."""
        return self.name != self.compute.name

    def encode(self, values: np.ndarray, out: np.ndarray) -> None:
        """Round `values` (run dtype) into `out` (storage dtype, same length). Values beyond the
        format's range become +-inf, which the master rejects as non-finite, never silently."""
        if self.name == "bfloat16":
            out[...] = _to_bfloat16(values)
        else:
            with np.errstate(over="ignore", under="ignore"):
                np.copyto(out, values, casting="unsafe")

    def decode(self, stored: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The values of a received payload, widened to the run's dtype into `out` (a new array
        when None; the payload itself, no copy, when the wire format is the run's dtype). Reusing
        `out` matters: widening into fresh memory costs more than twice as much (page faults)."""
        if not self.narrowed:
            return stored
        if out is None:
            out = np.empty(stored.shape, dtype=self.compute)
        if self.name != "bfloat16":
            np.copyto(out, stored)
        elif self.compute == np.float32:  # bfloat16 is float32's upper half: shift it into place
            np.left_shift(stored, 16, out=out.view(np.uint32), dtype=np.uint32)
        else:
            np.copyto(out, (stored.astype(np.uint32) << 16).view(np.float32))
        return out

    def decode_error(self, weights: np.ndarray | None) -> float:
        """The rounding error of a decoded gradient relative to its size, estimated from the decode
        weights a_i over the n workers: unit roundoff x n x max |a_i| (each message carries its own
        rounding, and the decode scales it by a_i; the mean-gradient weights 1/n give the format's
        own precision). 0 when nothing is rounded; pbs (weights None) averages its table, 1/n each.
        Measured against the true error in docs/BENCHMARKS.md section 14: within a few times."""
        if not self.narrowed:
            return 0.0
        if weights is None:
            return UNIT_ROUNDOFF[self.name]
        return UNIT_ROUNDOFF[self.name] * len(weights) * float(np.abs(weights).max())

    def round_trip(self, values: np.ndarray) -> np.ndarray:
        """`values` as the master receives them: rounded to the wire format and widened back."""
        if not self.narrowed:
            return values
        stored = np.empty(values.shape, dtype=self.storage)
        self.encode(values, stored)
        return self.decode(stored)


def wire_format(wire_dtype: str | None, compute_dtype: str | np.dtype) -> WireFormat:
    """The wire format of a run: `wire_dtype` (None: the run's dtype, nothing rounded)."""
    compute = np.dtype(compute_dtype)
    name = compute.name if wire_dtype is None else wire_dtype
    storage = np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)
    return WireFormat(name, storage, compute)


def _to_bfloat16(values: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of `values`: float32's upper half, rounded to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():  # rounding could carry a NaN's low payload bits into an infinity
        rounded[nan] = 0x7FC0
    return rounded
