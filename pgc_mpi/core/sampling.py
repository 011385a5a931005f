"""Splitting a data set into n partitions and drawing each partition's minibatches.

Both are pure functions of a seed (and, for the partitions that differ, of the training labels),
so every rank (and the simulator) derives the same partitions and the same minibatch for a given
(partition, draw index) without communicating.

--partitioning (PARTITIONINGS): `iid` cuts a seeded permutation (every partition a uniform random
sample); `by-label` cuts the samples sorted by class (ties in a seeded order), so each partition
holds one class or two; `dirichlet:ALPHA` draws each partition's class mix from a Dirichlet(ALPHA)
and fills the partition from its mix. Every kind gives sizes that differ by <= 1 (decoding averages
the partitions' mean gradients with equal weights: equal sizes keep that the mean over samples).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError

PARTITIONINGS = ("iid", "by-label", "dirichlet:ALPHA")
PARTITIONING_USAGE = "iid, by-label or dirichlet:ALPHA (ALPHA a number > 0)"


def parse_partitioning(spec: object) -> tuple[str, float | None]:
    """--partitioning as (kind, alpha): ('iid', None), ('by-label', None) or ('dirichlet', ALPHA);
    ConfigError in one line otherwise."""
    text = spec.strip().lower() if isinstance(spec, str) else None
    if text in ("iid", "by-label"):
        return text, None
    if text is not None and text.startswith("dirichlet:"):
        try:
            alpha = float(text.split(":", 1)[1])
        except ValueError:
            alpha = math.nan
        if math.isfinite(alpha) and alpha > 0:
            return "dirichlet", alpha
    raise ConfigError(f"--partitioning must be {PARTITIONING_USAGE}, got {spec!r}")


def needs_labels(partitioning: str) -> bool:
    """Whether a partitioning cuts by class (needs the training labels): every kind but iid."""
    return parse_partitioning(partitioning)[0] != "iid"


def refuse_unlabelled(partitioning: str, what: str) -> None:
    """The one error of a partitioning by class on data without class labels (`what` says which)."""
    raise ConfigError(f"--partitioning {partitioning} cuts the training data by class and needs a classification "
                      f"data set (integer labels); {what} has none: use --partitioning iid")


def partition_indices(num_samples: int, n: int, seed: int, partitioning: str = "iid",
                      labels: np.ndarray | None = None) -> list[np.ndarray]:
    """n disjoint partitions of range(num_samples), together every sample once; sizes differ by <= 1.

    `partitioning` (module docstring): iid (a seeded permutation, cut), by-label or dirichlet:ALPHA
    (these need `labels`, the training labels: integer classes). Each partition's indices are
    sorted (cheap contiguous reads from HDF5).
    """
    if num_samples < n:
        raise ConfigError(
            f"the data set has {num_samples} training samples, fewer than the {n} partitions "
            f"(one per worker): use fewer workers or a larger data set"
        )
    kind, alpha = parse_partitioning(partitioning)
    if kind == "iid":
        perm = np.random.default_rng([seed, 0x5A3D]).permutation(num_samples)
        return [np.sort(part) for part in np.array_split(perm, n)]
    labels = np.asarray(labels).reshape(-1) if labels is not None else None
    if labels is None or len(labels) != num_samples or not np.issubdtype(labels.dtype, np.integer):
        refuse_unlabelled(partitioning, "this data")
    if kind == "by-label":
        return _by_label(labels, n, seed)
    return _dirichlet(labels, n, seed, alpha)


def _by_label(labels: np.ndarray, n: int, seed: int) -> list[np.ndarray]:
    """The samples sorted by class, ties in a seeded order, cut into n consecutive runs."""
    perm = np.random.default_rng([seed, 0xB1AB]).permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]
    return [np.sort(part) for part in np.array_split(order, n)]


def _dirichlet(labels: np.ndarray, n: int, seed: int, alpha: float) -> list[np.ndarray]:
    """Partition j (in order) draws its class mix q_j ~ Dirichlet(alpha) over the classes and takes
    its size (array_split's) in samples of each class: a multinomial draw of its size from q_j,
    capped by the samples of each class still left, repeated on what it still needs (over the
    classes left, in proportion to q_j; uniformly over them where q_j gives them nothing). The
    classes' samples are taken in a seeded order. Later partitions take what earlier ones left, so
    their mixes drift from their draws when classes run out; every sample is placed once and no
    partition is empty (sizes differ by <= 1, and num_samples >= n)."""
    rng = np.random.default_rng([seed, 0xD1C7])
    classes, counts = np.unique(labels, return_counts=True)
    pools = [rng.permutation(np.flatnonzero(labels == k)) for k in classes]
    taken = np.zeros(len(classes), dtype=np.int64)
    sizes = [len(part) for part in np.array_split(np.arange(len(labels)), n)]
    parts = []
    for size in sizes:
        mix = rng.dirichlet(np.full(len(classes), alpha))
        want = np.zeros(len(classes), dtype=np.int64)
        need = size
        while need > 0:
            left = counts - taken - want
            p = np.where(left > 0, mix, 0.0)
            p = p if p.sum() > 0 else (left > 0).astype(float)
            draw = np.minimum(rng.multinomial(need, p / p.sum()), left)
            want += draw
            need -= int(draw.sum())
        parts.append(np.sort(np.concatenate([pool[start:start + k] for pool, start, k in zip(pools, taken, want)])))
        taken += want
    return parts


def minibatch_positions(size: int, batch_size: int | None, draw: int, seed: int, partition: int) -> np.ndarray:
    """Positions (0..size-1) within a partition of its `draw`-th minibatch.

    The partition is reshuffled every pass (epoch); a pass has ceil(size / batch_size) batches
    and the last one may be smaller. batch_size None (or >= size) means the whole partition.
    """
    if batch_size is None or batch_size >= size:
        return np.arange(size)
    per_pass = -(-size // batch_size)
    epoch, k = divmod(draw, per_pass)
    perm = np.random.default_rng([seed, partition, epoch, 0xB47C]).permutation(size)
    return np.sort(perm[k * batch_size:(k + 1) * batch_size])


def draw_seed(seed: int, partition: int, draw: int) -> int:
    """The seed of torch's generator while the `draw`-th minibatch of `partition` is read and
    computed: a random transform or dropout then draws the same on every worker that holds the
    partition, so gradient coding's copies agree and decoding stays exact."""
    state = np.random.SeedSequence([seed, partition, draw, 0x70C4]).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))
