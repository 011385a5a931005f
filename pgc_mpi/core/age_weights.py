"""Staleness-weighted coding (--staleness-correction): how a pipelined worker weighs its buffers.

A pgc-* worker's message combines its fresh buffer with c - 1 stale ones. The paper sends their
plain sum, so every computed gradient enters c consecutive decoded steps with weight 1 (a moving
average: a delay of (c - 1)/2 steps on average). Under momentum that delay costs stability at the
peak learning rate (docs/ALGORITHMS.md §13). `weights:R` sends sum_k e(age_k) * buffer_k instead,
with e(age) = c * R**age / sum_j R**j over the ages 0..c-1 of the rotation: the weights of a
message still sum to c, and each computed gradient still gets total weight c over its c uses
(once at every age), so nothing is inflated or lost; only its effective delay shrinks. R = 1 is
the paper's estimator, R = 0 sends the fresh buffer alone (c times it). The decoder is unchanged.

The age is the buffer's age in the rotation, (step - slot) mod c, a function of the schedule
alone: every holder of a partition weighs it alike (pgc-fr's group members still send equal
messages) and the mass identity holds step by step. A buffer refreshed early (--on-stale
refresh after missed steps) keeps the weight of its place in the rotation.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError
from .traits import TRAITS

CORRECTION_USAGE = "none (the paper's estimator) or weights:R with 0 <= R <= 1"
# The correction every pgc-* run uses unless told otherwise.
DEFAULT_CORRECTION = "weights:0.3"


def parse_correction(spec: object) -> float | None:
    """--staleness-correction as the ratio R of `weights:R` (None for `none`); ConfigError otherwise."""
    text = spec.strip().lower() if isinstance(spec, str) else None
    if text == "none":
        return None
    if text is not None and text.startswith("weights:"):
        try:
            ratio = float(text.split(":", 1)[1])
        except ValueError:
            ratio = math.nan
        if 0.0 <= ratio <= 1.0:
            return ratio
    raise ConfigError(f"--staleness-correction must be {CORRECTION_USAGE}, got {spec!r}")


def age_weights(c: int, ratio: float | None) -> np.ndarray:
    """e(0), ..., e(c-1): the weight of a buffer of each age in the rotation (ones for None)."""
    if ratio is None:
        return np.ones(c)
    powers = ratio ** np.arange(c, dtype=float)  # 0.0**0 is 1: the fresh buffer
    return c * powers / powers.sum()


def applied_correction(scheme: str, spec: object) -> str:
    """The correction a run of `scheme` applies: `spec` (None: a record from before the option,
    whose runs used the paper's estimator) for schemes whose messages hold stale buffers, `none` for
    every other scheme (they ignore it)."""
    row = TRAITS.get(scheme)
    if row is None or not row.stale_buffers or spec is None:
        return "none"
    try:  # one spelling per rule: weights:0.30 is weights:0.3
        ratio = parse_correction(spec)
    except ConfigError:
        return str(spec)  # a damaged record: compared as written, so it differs
    return "none" if ratio is None else f"weights:{ratio:g}"
