"""How much memory each rank of a run will allocate, from its configuration and the model's size.

pgc-train compares it, node by node, with what the ranks may still use before it allocates
(pgc_mpi.job.checks.memory_fits), so that a model too large for the machine ends in one
line instead of an OOM kill minutes later. The estimate counts the arrays whose size grows with
the model, by rank role; the process itself (Python, NumPy, MPI, torch) is already resident when
the check runs and is not counted. With D parameters, a server's shard of D/K, b bytes per
number in --dtype, w bytes per number on the wire, n workers and c buffers per message:

- worker: its stored data; D*b * (c stale buffers + 1 fresh gradient) + D*w * 2 (the model
  received, the message sent: the model is used and the message coded in place) + D*b * 3 when
  w differs from b (the model widened, the message coded before rounding, the rounding's
  temporary); a torch model adds
  D*4 * 3 (parameters, their .grad, the flattened gradient). A worker whose torch model is on a
  GPU holds the model, its gradients and its data in device memory, which is not the host's: it
  is charged D*b * 2 instead (the page-locked host mirrors of the parameters and the gradient) and
  one partition of data (read on the host on its way to the GPU); a worker whose Dataset is read
  by loader processes (--loader-workers) holds the minibatches of --prefetch + 1 jobs, c * --accumulate
  minibatches a job at most (the loader processes are forked: they share the rank's memory until
  they write to it, and what they allocate themselves is not counted);
- server k (rank k < K) of a shard of D_k: n*D_k*w (one receive row per worker; the master posts
  every worker's receive at once) + n*D_k*b more when w < b (each row widened to --dtype) +
  D_k*b * (2 + optimizer state: the parameters and the decoded gradient; momentum 1, adam 2) +
  D_k*w * 2 (send buffers) + pbs: n*D_k*b (its table of partition gradients) + 64 MiB (torch's
  optimizer, measured: the rest of the growth that does not scale with D); a server other than
  rank 0 also receives its start message (the shard, pickled: 2*D_k*b) and imports torch then
  (200 MiB);
- rank 0 also: with K > 1, D*b (the whole model, gathered for evaluation) and 2*(D - D_0)*b (the
  other servers' start messages, pickled), the master's problem (a torch
  model: D*4 * 2 and its evaluation data), and with --record-params (steps+1)*D*b.

A synthetic --problem is built whole on every rank (least-squares and logistic: samples*dim*8
bytes; quadratic: about 1 MiB whatever its dim). docs/reliability.md compares the estimate with
measured peaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .train import TrainConfig

MiB = 1 << 20
# vectors of the shard besides the parameters; a user's optimizer (PATH:NAME) is counted as Adam's two
_OPTIMIZER_STATE = {"sgd": 0, "momentum": 1, "nesterov": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class ProblemSize:
    """What the estimate needs to know of the problem: its parameter count, whether it is a torch
    model, the bytes a worker holds per stored partition, and the bytes of the problem every rank
    builds whole (a synthetic one) or of the master's evaluation data."""

    dim: int
    torch: bool
    partition_bytes: float = 0.0
    whole_bytes: float = 0.0
    master_data_bytes: float = 0.0
    minibatch_bytes: float = 0.0  # one minibatch of a lazy source (a Dataset), as loaders hold it ahead


def synthetic_size(cfg: TrainConfig) -> ProblemSize:
    """A synthetic --problem's size, from its options alone (it is built whole on every rank)."""
    whole = 1 * MiB if cfg.problem == "quadratic" else cfg.samples * (cfg.dim + 1) * 8.0
    return ProblemSize(dim=int(cfg.dim), torch=False, whole_bytes=whole)


def torch_size(dim: int, sample_shape: tuple[int, ...], num_train: int, num_test: int, n: int, held: bool,
               eval_train: bool, batch_size: int | None = None) -> ProblemSize:
    """A torch problem's size: `held` when the workers hold their partitions' rows in memory (HDF5
    files, arrays; a Dataset is read a minibatch at a time, of `batch_size` rows: None, a partition)."""
    sample = 4.0 * math.prod(sample_shape) + 8  # float32 features and an int64 label
    partition = sample * num_train / n if held else 0.0
    master = sample * ((num_train if eval_train else 0) + num_test) if held else 0.0
    minibatch = 0.0 if held else sample * min(batch_size or num_train, math.ceil(num_train / n))
    return ProblemSize(dim=dim, torch=True, partition_bytes=partition, master_data_bytes=master,
                       minibatch_bytes=minibatch)


@dataclass(frozen=True)
class Need:
    """One rank's estimated allocations: bytes by what they are for."""

    role: str
    parts: tuple[tuple[str, float], ...]

    @property
    def total(self) -> float:
        return sum(b for _, b in self.parts)

    def describe(self) -> str:
        """'2.3 GiB (3 receive rows 1.1 GiB, ...)': the largest parts first."""
        big = sorted(self.parts, key=lambda p: -p[1])[:3]
        return f"{gib(self.total)} ({', '.join(f'{name} {gib(b)}' for name, b in big if b > 0)})"


def gib(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB" if nbytes >= 1 << 30 else f"{nbytes / MiB:.0f} MiB"


def rank_need(cfg: TrainConfig, scheme, size: ProblemSize, rank: int, built: bool = False,
              torch_loaded: bool = True, gpu: bool = False) -> Need:
    """The estimated host allocations of `rank` (module docstring): servers are ranks 0..K-1, the
    workers the rest (with the ddp baseline every rank but 0 is a worker). `built`: the rank's
    problem is built already (rank 0's, at pgc-train's check), and is left out; `torch_loaded`:
    whether the rank has imported torch yet (a server other than rank 0 imports it later); `gpu`:
    the rank computes on a GPU (a worker's torch model and data are then in device memory)."""
    b = np.dtype(cfg.dtype).itemsize
    w = 2 if cfg.wire_dtype in ("bfloat16", "float16") else np.dtype(cfg.wire_dtype or cfg.dtype).itemsize
    d, n, servers = size.dim, scheme.n, cfg.servers
    problem = ("problem", 0.0 if built else size.whole_bytes)
    if rank >= servers:
        stored = len(scheme.placement[rank - servers])
        on_gpu = gpu and size.torch
        data = ("data, a partition at a time on its way to the GPU", min(stored, 1) * size.partition_bytes) \
            if on_gpu else ("data", stored * size.partition_bytes)
        parts = [problem, data, (f"{scheme.c} stale buffers", scheme.c * d * b), ("fresh gradient", d * b),
                 ("send and receive buffers", 2 * d * w),
                 ("widened model, message and its rounding", 3 * d * b if w != b else 0.0)]
        if size.minibatch_bytes and cfg.loader_processes(lazy=True):  # each job: c minibatches at most
            parts.append((f"minibatches of {cfg.prefetch + 1} jobs loaded ahead",
                          (cfg.prefetch + 1) * scheme.c * cfg.accumulate * size.minibatch_bytes))
        if on_gpu:
            parts.append(("page-locked mirrors of the GPU's parameters and gradient", 2 * d * b))
        elif size.torch:
            parts.append(("torch parameters and gradients", 3 * d * 4))
        return Need("worker", tuple(parts))
    shard = d // servers + (rank < d % servers)
    parts = [problem, (f"{n} receive rows", n * shard * w), ("widened rows", n * shard * b if w < b else 0.0),
             ("parameters, gradient, optimizer", (2 + _OPTIMIZER_STATE.get(cfg.optimizer, 2)) * shard * b),
             ("torch optimizer", 64 * MiB),
             ("send buffers", 2 * shard * w)]
    if scheme.kind == "table":
        parts.append((f"table of {n} partition gradients", n * shard * b))
    if rank > 0:  # its start message (the shard, pickled) arrives whole, and it imports torch then
        parts += [("start message", 2 * shard * b), ("torch", 0.0 if torch_loaded else 200 * MiB)]
        return Need("server", tuple(parts))
    parts += [("whole model", d * b if servers > 1 else 0.0),
              ("start messages to the other servers", 2 * (d - shard) * b)]
    if size.torch and not built:
        parts += [("evaluation model", 2 * d * 4), ("evaluation data", size.master_data_bytes)]
    if cfg.record_params:
        parts.append(("recorded parameters", (cfg.steps + 1) * d * b))
    return Need("master", tuple(parts))
