"""The straggler schemes as pure, MPI-free objects: placement, rotation, encoding, decoding.

Every coded scheme answers the same questions for its drivers (the MPI master and workers and
the simulator): which partitions a worker stores, which of them it computes fresh at a step,
what coefficients it sends them with, when the master may decode, and with which weights.
pbs (the bounded-staleness partition table) answers the worker-side questions and hands the
master a PartitionTable instead of decode weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, NotDecodable, SchemeError
from .age_weights import DEFAULT_CORRECTION, age_weights, parse_correction
from .encoding import (
    disjoint_windows,
    solve_exact,
    solve_least_squares,
    support_matrix,
    tandon_cr_matrix,
)
from .placement import cr_placement, fr_placement, single_placement
from .table import PartitionTable
from .traits import SCHEME_NAMES, traits

# is-gc-fr and is-gc-cr store this many partitions per worker unless told otherwise: the paper's
# choice for every s (it fixes the computation per step, c gradients, whatever s is).
IS_GC_DEFAULT_C = 2
# pbs stores every partition on this many workers unless told otherwise (--replication).
PBS_DEFAULT_REPLICATION = 2

# When FR schemes (gc-fr, is-gc-fr, pgc-fr) decode: `covered`, as soon as every group has one
# arrival (exact, often before n - s arrivals: the original gradient-coding code's rule), or
# `n-s`, after the first n - s arrivals (the paper's master). The decoded gradient is the same.
FR_DECODE_RULES = ("covered", "n-s")
# What a pipelined worker does with buffers older than the staleness bound (after missed steps):
# recompute them at the current model before sending, or send them and have the message rejected.
ON_STALE = ("refresh", "reject")


@dataclass(frozen=True)
class _Rule:
    """How a coded scheme places and decodes (its other traits: pgc_mpi.core.traits)."""

    placement: str  # "single", "fr" or "cr"
    decoder: str  # "average", "groups", "tandon" or "windows"
    exact: bool  # decodes the exact mean gradient (given fresh buffers)


_RULES = {
    "dgd": _Rule("single", "average", exact=True),
    "is-sgd": _Rule("single", "average", exact=False),
    "gc-fr": _Rule("fr", "groups", exact=True),
    "gc-cr": _Rule("cr", "tandon", exact=True),
    "is-gc-fr": _Rule("fr", "groups", exact=False),
    "is-gc-cr": _Rule("cr", "windows", exact=False),
    "pgc-fr": _Rule("fr", "groups", exact=True),
    "pgc-cr": _Rule("cr", "average", exact=False),
}


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SchemeError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise SchemeError(f"{name} must be >= {low}, got {value}")
    return int(value)


def staleness(step: int, version: int, first: int = 0) -> int:
    """How many steps old, at `step`, a buffer of `version` is: the model it was computed at is
    that of step max(version, first), since warm-up buffers (virtual versions below `first`, the
    step a run or resumed run starts at) are computed at the first model."""
    return step - max(version, first)


class Scheme:
    """What every scheme shares: its name, n workers, s stragglers, c slots and the placement."""

    name: str
    kind: str  # "coded" (decode weights) or "table" (pbs)
    pipelined: bool

    def __init__(self, name: str, n: int, s: int, c: int, placement: list[list[int]]):
        self.name, self.n, self.s, self.c = name, n, s, c
        self.placement = placement

    def fresh_slots(self, step: int, worker: int) -> tuple[int, ...]:
        """Slots (indices into placement[worker]) the worker computes fresh at `step`."""
        self._check_worker(worker)
        if self.pipelined:
            return (step % self.c,)
        return tuple(range(self.c))

    def _check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.n:
            raise SchemeError(f"worker id {worker} is outside 0..{self.n - 1}")

    def check_arrivals(self, arrived: Sequence[int]) -> list[int]:
        """Arrived worker ids as a list; unknown or repeated ids are a SchemeError."""
        ids = [int(i) for i in arrived]
        bad = [i for i in ids if not 0 <= i < self.n]
        if bad:
            raise SchemeError(f"arrivals contain unknown worker ids {bad}; valid ids are 0..{self.n - 1}")
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise SchemeError(f"arrivals contain duplicate worker ids {dup}")
        return ids

    def __repr__(self) -> str:
        return f"make_scheme({self.name!r}, n={self.n}, s={self.s}, c={self.c})"


class CodedScheme(Scheme):
    """A scheme whose workers send one coded message per step and whose master decodes it.

    Worker i sends m_i = sum_j B[i, j] * buffer_i[j]; the master, from the arrived set F, forms
    g_hat = sum_{i in F} a_i m_i, an estimate of the mean gradient (1/n) sum_j g_j.

    Pipelined schemes (pgc-*) compute slot `step % c` fresh and keep the other slots' buffers
    from earlier steps. Their warm-up buffers carry the virtual version `slot - c` (computed at
    the initial model), as if the pipeline had been running since before step 0; the fresh slot
    of step 0 is not computed in the warm-up because step 0 overwrites it.
    """

    kind = "coded"

    def __init__(self, name: str, n: int, s: int, c: int, seed: int, fr_decode: str = "covered",
                 correction: float | None = None):
        rule = _RULES[name]
        if rule.placement == "single":
            placement = single_placement(n)
        elif rule.placement == "fr":
            placement = fr_placement(n, c)
        else:
            placement = cr_placement(n, c)
        super().__init__(name, n, s, c, placement)
        self.rule = rule
        self.pipelined = traits(name).pipelined
        self.exact = rule.exact
        if rule.decoder == "tandon":
            self._B = tandon_cr_matrix(n, s, seed)
        else:
            self._B = support_matrix(placement, n)
        self.min_arrivals = n if traits(name).waits_for_all else n - s
        self.fr_decode = fr_decode
        # --staleness-correction weights:R (pgc_mpi.core.age_weights): the weight of a buffer of each
        # age in the rotation; ones (the plain sum) for the paper's estimator and unpipelined schemes
        self.correction = correction if traits(name).stale_buffers else None
        self._ages = age_weights(c, self.correction)
        # decoders whose weights are one common factor on a set known arrival by arrival: the
        # master can sum messages as they come and scale once at the end
        self.streams = rule.decoder in ("average", "groups")

    def encoding_matrix(self) -> np.ndarray:
        """The n x n encoding matrix B (a copy): row i is supported on placement[i]."""
        return self._B.copy()

    def coefficients(self, worker: int) -> np.ndarray:
        """B[worker, placement[worker]]: the coefficient of each slot in the worker's message."""
        self._check_worker(worker)
        return self._B[worker, self.placement[worker]].copy()

    def message_coefficients(self, worker: int, step: int) -> np.ndarray:
        """What the worker's message for `step` multiplies each slot's buffer by: its coefficient,
        times the weight of the buffer's age in the rotation, (step - slot) mod c, under
        --staleness-correction (pgc_mpi.core.age_weights); the coefficients alone otherwise."""
        coef = self.coefficients(worker)
        if self.correction is None:
            return coef
        return coef * self._ages[(step - np.arange(self.c)) % self.c]

    def staleness_window(self) -> int:
        """The staleness the scheme's own rotation implies: a pipelined worker that answers every
        step sends buffers at most c - 1 steps old; the others send only fresh gradients (0)."""
        return self.c - 1 if self.pipelined else 0

    def refresh_slots(self, worker: int, step: int, versions: Sequence[int], bound: int | None,
                      first: int = 0) -> tuple[int, ...]:
        """Stored slots (not fresh at `step`) whose buffers are older than `bound` at `step`: a
        worker that missed steps recomputes them at the current model before it sends (the
        catch-up of --on-stale refresh), so its message stays within the bound. None: no bound."""
        if bound is None or not self.pipelined:
            return ()
        fresh = self.fresh_slots(step, worker)
        return tuple(k for k, v in enumerate(versions) if k not in fresh and staleness(step, v, first) > bound)

    def job_slots(self, worker: int, step: int, versions: Sequence[int], bound: int | None,
                  first: int = 0) -> tuple[int, ...]:
        """The slots a job at `step` computes: the catch-up ones first (refresh_slots), then the
        step's fresh ones."""
        return (*self.refresh_slots(worker, step, versions, bound, first), *self.fresh_slots(step, worker))

    def warmup_slots(self, worker: int, step: int = 0) -> tuple[int, ...]:
        """Slots a pipelined worker computes at its first model, of step `step` (0, or the step a
        resumed run starts at), before that step's own fresh slot; none for other schemes."""
        self._check_worker(worker)
        fresh = self.fresh_slots(step, worker)
        return tuple(k for k in range(self.c) if k not in fresh) if self.pipelined else ()

    def warmup_versions(self, step: int = 0) -> list[int]:
        """Version stamps of the buffers after a warm-up at the model of `step`: each slot gets the
        last step before `step` at which the rotation made it fresh, as if the pipeline had been
        running all along (k - c at step 0; the slot fresh at `step` gets step - c, overwritten
        at once). They fix the minibatch draws and the staleness
        bookkeeping; the gradients themselves are computed at the warm-up model."""
        return [step - ((step - k) % self.c or self.c) for k in range(self.c)]

    def initial_versions(self) -> list[int]:
        """Version stamps of the buffers after the warm-up before step 0 (see the class docstring)."""
        return self.warmup_versions(0)

    def draw_index(self, version: int, slot: int) -> int:
        """Which minibatch of the slot's partition a buffer of this version uses.

        A pure function of (version, slot), so every worker that computes a partition for the
        same step uses the same minibatch (exact decoding relies on it), and a worker that
        skipped steps still draws what the schedule says. Each partition's draws run 0, 1, 2...
        over the computations the schedule makes of it, warm-up included: every step for
        gc-*/dgd/is-* and pgc-cr (one holder per step), every c-th step for pgc-fr.
        """
        if not self.pipelined:
            return version
        if self.rule.placement == "cr":  # warm-up: slots 1..c-1 draw 0..c-2; step t draws t + c - 1
            return version + self.c - 1
        return (version - slot) // self.c + (1 if slot > 0 else 0)

    def ready(self, arrived: Sequence[int]) -> bool:
        """Whether the master may decode now from these arrivals."""
        tracker = self.tracker()
        for i in self.check_arrivals(arrived):
            tracker.add(i)
        return tracker.is_ready()

    def tracker(self) -> ReadyTracker:
        """An incremental ready() for a master that sees one arrival at a time (O(1) each)."""
        return ReadyTracker(self)

    def decode_weights(self, arrived: Sequence[int], partial: bool = False) -> np.ndarray:
        """Length-n weights a with g_hat = sum_i a[i] m_i; zero for workers not used.

        With partial=False the arrivals must satisfy ready() (else NotDecodable). With
        partial=True the scheme decodes as well as it can from whatever arrived (a missed
        deadline); see residual() for how far that is from the mean gradient.
        """
        ids = self.check_arrivals(arrived)
        if not ids:
            raise NotDecodable(f"{self.name}: no worker has arrived, nothing to decode")
        if not partial and not self.ready(ids):
            covered = self.rule.decoder == "groups" and self.exact and self.fr_decode == "covered"
            need = "every group" if covered else f"{self.min_arrivals} workers"
            raise NotDecodable(
                f"{self.name} (n={self.n}, s={self.s}) needs {need}, got {len(ids)} arrivals {ids}"
            )
        a = np.zeros(self.n)
        decoder = self.rule.decoder
        if decoder == "average":
            a[ids] = 1.0 / (len(ids) * self.c)
        elif decoder == "groups":
            firsts = list(self._groups(ids).values())
            a[firsts] = 1.0 / (len(firsts) * self.c)
        elif decoder == "tandon":
            a = solve_least_squares(self._B, ids) if partial else solve_exact(self._B, ids)
        else:
            chosen = disjoint_windows(ids, self.n, self.c)
            a[chosen] = 1.0 / (len(chosen) * self.c)
        return a

    def partition_weights(self, a: np.ndarray) -> np.ndarray:
        """pi = a^T B: the weight each partition's gradient gets in g_hat (1/n when exact)."""
        return np.asarray(a) @ self._B

    def residual(self, a: np.ndarray) -> float:
        """||a^T B - (1/n) 1||_2: how far a decode is from the mean gradient's weights."""
        return float(np.linalg.norm(self.partition_weights(a) - 1.0 / self.n))

    def _groups(self, ids: list[int]) -> dict[int, int]:
        """First arrival of each FR group: {group: worker}."""
        firsts: dict[int, int] = {}
        for i in ids:
            firsts.setdefault(i // self.c, i)
        return firsts


class ReadyTracker:
    """ready() one arrival at a time; the caller guarantees ids are valid and distinct."""

    def __init__(self, scheme: CodedScheme):
        self.scheme = scheme
        self.count = 0
        self.counted = False
        self.groups: set[int] = set()
        self._by_groups = scheme.rule.decoder == "groups"
        self._groups_needed = scheme.n // scheme.c
        self._when_covered = scheme.fr_decode == "covered"

    def add(self, worker: int) -> bool:
        """Count one more arrival; returns whether the step is now decodable.

        Afterwards `counted` tells whether this arrival's message enters the decoded sum of a
        streaming decoder (every arrival for averages, the first of its group for FR).
        """
        self.count += 1
        self.counted = True
        if self._by_groups:
            group = worker // self.scheme.c
            self.counted = group not in self.groups
            self.groups.add(group)
        return self.is_ready()

    def is_ready(self) -> bool:
        """Whether the arrivals so far satisfy the decode condition."""
        if self._by_groups and self._when_covered:
            if len(self.groups) == self._groups_needed:
                return True  # every group covered: the exact gradient is available
            if self.scheme.exact:
                return False
        # the first n - s arrivals (with c = s + 1 they cover every FR group)
        return self.count >= self.scheme.min_arrivals


class PbsScheme(Scheme):
    """Bounded-staleness partition table (`pbs`).

    Worker i stores the R = `replication` partitions (i, ..., i+R-1) mod n (held in `c`, the
    slots per worker, like every scheme) and, each time it has a model, computes one minibatch
    gradient of its next stored partition (cyclically: its k-th computation uses slot k % R) and
    sends (partition, gradient, version). The master keeps a PartitionTable (new_table) of the
    newest gradient of every partition and steps as soon as every entry is younger than
    `window` (C) steps and one of them is new since the previous step.
    """

    kind = "table"
    pipelined = True

    def __init__(self, n: int, s: int, replication: int, window: int | None = None):
        super().__init__("pbs", n, s, replication, cr_placement(n, replication))
        self.replication = replication
        self.table_window = replication if window is None else window

    def staleness_window(self) -> int:
        """The oldest entry the table steps with: C - 1 steps."""
        return self.table_window - 1

    def __repr__(self) -> str:
        return f"make_scheme('pbs', n={self.n}, s={self.s}, replication={self.c}, c={self.table_window})"

    def fresh_slots(self, step: int, worker: int) -> tuple[int, ...]:
        """For pbs `step` is the worker's own computation count: slot step % c."""
        self._check_worker(worker)
        return (step % self.c,)

    def partition_for(self, worker: int, count: int) -> int:
        """The partition of the worker's `count`-th computation."""
        return self.placement[worker][self.fresh_slots(count, worker)[0]]

    def draw_index(self, count: int, slot: int) -> int:
        """Minibatch index of a computation; the c holders of a partition interleave their draws."""
        return count // self.c * self.c + slot

    def new_table(self, dim: int, dtype: np.dtype | type = np.float64) -> PartitionTable:
        """An empty table for gradients of `dim` parameters, with the staleness window C."""
        return PartitionTable(self.n, self.table_window, dim, dtype)

    def encoding_matrix(self) -> np.ndarray:
        """pbs sends single partition gradients, not coded messages."""
        raise SchemeError("pbs sends single partition gradients, not coded messages: use new_table()")


def make_scheme(
    name: str, n: int, s: int, seed: int = 0, c: int | None = None, fr_decode: str = "covered",
    replication: int | None = None, staleness_correction: str = DEFAULT_CORRECTION,
) -> CodedScheme | PbsScheme:
    """Build a scheme by name for n workers tolerating s stragglers.

    c is the partitions per worker of is-gc-fr and is-gc-cr (default 2, capped at n) and the
    staleness window C of pbs (default: its replication); every other replicated scheme uses
    c = s + 1 (dgd and is-sgd use c = 1). `replication` (pbs only, default 2) is how many
    workers store each partition. `seed` fixes gc-cr's random encoding. `fr_decode` is when FR
    schemes decode (FR_DECODE_RULES); other schemes ignore it. `staleness_correction` is how
    pgc-fr and pgc-cr weigh their buffers by age (pgc_mpi.core.age_weights); other schemes ignore it.
    """
    if name not in SCHEME_NAMES:
        raise SchemeError(f"unknown scheme {name!r}; choose one of: {', '.join(SCHEME_NAMES)}")
    if fr_decode not in FR_DECODE_RULES:
        raise SchemeError(f"--fr-decode {fr_decode!r} is not one of: {', '.join(FR_DECODE_RULES)}")
    try:
        correction = parse_correction(staleness_correction)
    except ConfigError as exc:
        raise SchemeError(str(exc)) from None
    n = _check_int("n (workers)", n, 1)
    s = _check_int("s (stragglers)", s, 0)
    if s >= n:
        raise SchemeError(f"s must be smaller than n (the master needs n-s >= 1 workers), got n={n}, s={s}")
    if c is not None and not traits(name).sets_c:
        raise SchemeError(f"c applies only to is-gc-fr, is-gc-cr and pbs; {name} uses c = s + 1")
    if replication is not None and not traits(name).table:
        raise SchemeError(f"replication applies only to pbs; {name} replicates each partition s + 1 times")
    if traits(name).table:
        return _make_pbs(n, s, c, replication)
    if _RULES[name].placement == "single":
        c = 1
    elif c is None:
        c = min(IS_GC_DEFAULT_C, n) if traits(name).sets_c else s + 1
    c = _check_int("c (partitions per worker)", c, 1)
    if c > n:
        raise SchemeError(f"c must be at most n (a worker cannot store more than n partitions), got n={n}, c={c}")
    if name.endswith("-fr") and n % c:
        raise SchemeError(
            f"{name} needs n divisible by c = {c} (fractional repetition), got n={n}: "
            f"use a multiple of {c} workers or the cyclic variant {name[:-3]}-cr"
        )
    return CodedScheme(name, n, s, c, seed, fr_decode, correction)


def _make_pbs(n: int, s: int, window: int | None, replication: int | None) -> PbsScheme:
    replication = _check_int("replication", min(PBS_DEFAULT_REPLICATION, n) if replication is None else replication, 1)
    if replication > n:
        raise SchemeError(f"pbs replication must be at most n (each copy is on a different worker), "
                          f"got n={n}, replication={replication}")
    window = replication if window is None else _check_int("c (pbs staleness window)", window, 1)
    return PbsScheme(n, s, replication, window)
