"""A worker's minibatches: held rows sliced in memory, or a lazy source's rows read (or loaded
ahead) a minibatch at a time; and how long the worker waited for them (`data_wait`).

Arrays, HDF5 files and the built-in sets are held: a worker reads the rows of its stored
partitions once, at start, and a minibatch is a slice of them (no loading on the step's path). A
torch Dataset is lazy: each minibatch calls `__getitem__` for its rows, with the user's transforms.
Those reads are what loaders hide (`start_loaders`: pgc_mpi.learning.prefetch): the worker names
the minibatches it computes next (`expect`) and loader processes read them while it computes,
sends and waits. A minibatch comes out bit for bit the same either way.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from ..core.sampling import draw_seed, minibatch_positions
from .prefetch import Prefetcher

Tensors = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (x, y, pinned=False) -> tensors on the device
# --loader-workers auto: the first TRIAL_READS minibatches are read in place, and loaders start only
# where their median read took WORTH_LOADING seconds or more. Handing a loaded minibatch over costs
# about 0.1 ms, but the loaders are processes beside the rank's: where reads are about free, 12
# workers' 24 loaders sharing 2 cores made steps 8-13 % slower (docs/BENCHMARKS.md §27).
TRIAL_READS = 8
WORTH_LOADING = 0.002

log = logging.getLogger("pgc_mpi")


class Minibatches:
    """The minibatches of the `stored` partitions (row indices `partitions`) of `source`, as
    tensors on the device (`tensors`: the problem's conversion), drawn by
    pgc_mpi.core.sampling.minibatch_positions with `batch_size` and `seed`."""

    def __init__(self, source: Any, partitions: Sequence[np.ndarray], stored: Iterable[int],
                 batch_size: int | None, seed: int, tensors: Tensors):
        self.source, self.partitions, self.batch_size, self.seed = source, partitions, batch_size, seed
        self.tensors = tensors
        self.lazy = getattr(source, "lazy", False)
        # held rows: {partition: (x, y)} of every stored partition, read once (none for a lazy source)
        self.held = {} if self.lazy else {j: tensors(*source.read_train(partitions[j])) for j in stored}
        self.loader: Prefetcher | None = None
        self.loaders = 0  # the loader processes to start (start_loaders)
        self.trial: list[float] | None = None  # --loader-workers auto: the first reads' times, until decided
        self.data_wait = 0.0  # seconds spent getting minibatches since take_data_wait

    def get(self, partition: int, draw: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The minibatch's tensors, with torch's generator seeded for it already (by the caller,
        pgc_mpi.learning.torch_problem): a lazy source's read consumes it as its transforms draw,
        and a minibatch loaded ahead sets it to where that read would have left it. The time
        a lazy source's minibatch takes counts as data wait (held rows' slicing is computation)."""
        if not self.lazy:  # a slice of memory: part of the computation, not a wait for data
            x, y = self.held[partition]
            pos = torch.from_numpy(self._positions(partition, draw, len(y))).to(y.device)
            return x[pos], y[pos]
        began = time.perf_counter()
        try:
            loaded = self.loader.take((partition, draw)) if self.loader is not None else None
            if loaded is None:
                return self.tensors(*self._read(partition, draw))
            x, y, after = loaded
            torch.set_rng_state(after)
            return self.tensors(x, y, pinned=True)
        finally:
            took = time.perf_counter() - began
            self.data_wait += took
            if self.trial is not None:
                self._tried(took)

    def _positions(self, partition: int, draw: int, rows: int) -> np.ndarray:
        return minibatch_positions(rows, self.batch_size, draw, self.seed, partition)

    def _read(self, partition: int, draw: int) -> tuple[Any, Any]:
        """A lazy source's rows of the minibatch (with whatever transforms the source applies)."""
        rows = self.partitions[partition]
        return self.source.read_train(rows[self._positions(partition, draw, len(rows))])

    def _load_ahead(self, key: tuple[int, int]) -> tuple[Any, Any, torch.Tensor]:
        """In a loader process: the minibatch `key` read as `get` would read it, torch's generator
        seeded as its caller seeds it, and the generator's state after the read."""
        partition, draw = key
        torch.manual_seed(draw_seed(self.seed, partition, draw))
        x, y = self._read(partition, draw)
        return x, y, torch.get_rng_state()

    def start_loaders(self, workers: int, when_slow: bool = False) -> bool:
        """Load the expected minibatches ahead in `workers` processes; `when_slow` (--loader-workers
        auto): only once the first TRIAL_READS reads in place show that they take long enough to
        be worth it. Only a lazy source has reads to hide (held rows are sliced in memory): returns
        whether loaders were started, or may be."""
        if workers < 1 or not self.lazy or self.loader is not None:
            return False
        self.loaders = workers
        if when_slow:
            self.trial = []
        else:
            self.loader = Prefetcher(self._load_ahead, workers)
        return True

    @property
    def loads_ahead(self) -> bool:
        """Whether minibatches are loaded ahead, or may be once the trial reads decide."""
        return self.loader is not None or self.trial is not None

    def _tried(self, took: float) -> None:
        self.trial.append(took)
        if len(self.trial) < TRIAL_READS:
            return
        median, self.trial = statistics.median(self.trial), None
        if median >= WORTH_LOADING:
            self.loader = Prefetcher(self._load_ahead, self.loaders)
        log.debug("a minibatch read took %.3g ms (median of %d): %s", 1e3 * median, TRIAL_READS,
                  f"{self.loaders} loader processes read them ahead from now on" if self.loader is not None
                  else f"read in place (loaders start at {1e3 * WORTH_LOADING:g} ms)")

    def expect(self, draws: Iterable[tuple[int, int]]) -> None:
        """The (partition, draw) minibatches needed next, in order: the loaders (if started) read
        them ahead and drop whatever they hold for any other."""
        if self.loader is not None:
            self.loader.expect(draws)

    def take_data_wait(self) -> float:
        """Seconds spent getting a lazy source's minibatches since the last call: reading them, or
        waiting for a loader (held rows' slicing counts as computation)."""
        waited, self.data_wait = self.data_wait, 0.0
        return waited

    def close(self) -> None:
        """Stop the loaders, if any."""
        if self.loader is not None:
            self.loader.close()
