"""Minibatches loaded ahead, in loader processes, in the order the schedule says they are needed.

A worker's minibatches are a pure function of (seed, partition, draw) (pgc_mpi.core.sampling), so
the worker knows which it will compute next before its next model arrives: the worker names them
(`expect`, the next jobs' draws in order) and a pool of loader processes reads them meanwhile,
while the worker computes, sends and waits. `take` hands over a loaded minibatch, waiting for it if
its load is under way; a minibatch nobody asked for (the prediction was wrong: a straggler's
skipped steps, a catch-up refresh) is read by the caller itself, and what was loaded for nothing is
dropped at the next `expect`, so at most the expected minibatches are ever held.

The loaders are forked (as torch's DataLoader on Linux): they inherit the data source, however it
was built, and never touch MPI (they end with os._exit, as multiprocessing's forked children do,
and die with their rank: PR_SET_PDEATHSIG). Each loads with torch's generator seeded as the caller
would seed it and returns the generator's state after the load, which the caller restores: a
random transform draws what it would draw in the caller, and the forward pass after it (dropout)
continues the same stream, so a prefetched minibatch gives the same bits as one read in place.

When the loaders fail (a loader process dies, or the data source raises in one), the pool is given
up with one warning and the caller reads every minibatch itself from then on: a source that raises
there too ends the run with the caller's one-line error, as without loaders.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import signal
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

log = logging.getLogger("pgc_mpi")

_LOAD: Callable[[Hashable], Any] | None = None  # in a loader process: what it loads with
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _start_loader(load: Callable[[Hashable], Any]) -> None:
    """A loader process's start: one torch thread (the rank's cores are its compute's), death with
    its rank, and no KeyboardInterrupt of its own (a Ctrl-C reaches the rank, which stops the loaders)."""
    global _LOAD
    _LOAD = load
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: an orphan ends when its queue closes
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    torch.set_num_threads(1)


def _load_in_loader(key: Hashable) -> Any:
    return _LOAD(key)


class Prefetcher:
    """Loads the values of keys ahead in `workers` forked processes with `load(key)` (see the module)."""

    def __init__(self, load: Callable[[Hashable], Any], workers: int):
        if workers < 1:
            raise ValueError(f"a Prefetcher needs at least one loader process, got {workers}")
        self.load, self.workers = load, workers
        self._pool: ProcessPoolExecutor | None = None
        self._wanted: dict[Hashable, Future] = {}
        self.failed: str | None = None  # why the loaders were given up (None: they work)

    @property
    def active(self) -> bool:
        """Whether the loaders load (False once given up, or closed)."""
        return self.failed is None

    def expect(self, keys: Iterable[Hashable]) -> None:
        """The keys needed next, in the order they are needed: those not under way start loading
        (in this order), and whatever was loaded or is loading for another key is dropped."""
        if self.failed is not None:
            return
        keys = list(dict.fromkeys(keys))
        for key in set(self._wanted) - set(keys):
            self._wanted.pop(key).cancel()  # a load under way runs out; its result is dropped
        try:
            for key in keys:
                if key not in self._wanted:
                    self._wanted[key] = self._executor().submit(_load_in_loader, key)
        except BrokenProcessPool as exc:  # a loader died since the last take
            self._give_up(f"a loader process died ({exc})")

    def take(self, key: Hashable) -> Any | None:
        """The loaded value of `key` (waiting for it if its load is under way), or None when it
        was not expected or the loaders failed: the caller then loads it itself."""
        future = self._wanted.pop(key, None)
        if future is None:
            return None
        try:
            return future.result()
        except BrokenProcessPool as exc:
            self._give_up(f"a loader process died ({exc})")
        except Exception as exc:  # noqa: BLE001 - the user's data source, raised in a loader
            text = str(exc).strip().splitlines()
            self._give_up(f"a loader raised {type(exc).__name__}: {text[0] if text else ''}")
        return None

    def held(self) -> int:
        """How many keys are loaded or loading (at most the last `expect`'s)."""
        return len(self._wanted)

    def close(self) -> None:
        """Stop the loaders: what is queued is dropped, a load under way runs out."""
        self._wanted.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, multiprocessing.get_context("fork"),
                                             initializer=_start_loader, initargs=(self.load,))
        return self._pool

    def _give_up(self, why: str) -> None:
        self.failed = why
        self.close()
        log.warning("%s: this worker reads its minibatches itself from now on (as with --loader-workers 0)", why)
