"""Start-up checks that every rank takes part in (collectives), each ending in one line from rank
0 and the same verdict on every rank: the same model everywhere, and enough memory for it."""

from __future__ import annotations

import math
import sys


def say(line: str) -> None:
    """One line on standard error in a single write: mpiexec interleaves the ranks' output write by
    write, and a message whose newline came in a second write ran into another rank's line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type, and its message's first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def same_model(comm, problem, prog: str) -> bool:
    """Whether every rank that built a problem built the same parameters (count and shapes, in
    order; a collective). Rank 0 says which rank differs, in one line, otherwise: a factory that
    reads something rank-dependent, or files that differ between nodes."""
    shapes = getattr(problem, "param_shapes", None) if problem is not None else None
    gathered = comm.gather(shapes, root=0)
    message = None
    if comm.Get_rank() == 0:
        mine = gathered[0]
        for rank, theirs in enumerate(gathered):
            if theirs is not None and theirs != mine:
                message = (f"{prog}: error: rank {rank} built a model with {len(theirs)} parameter tensors "
                           f"({sum(_count(s) for s in theirs)} numbers), rank 0 one with {len(mine)} "
                           f"({sum(_count(s) for s in mine)}): every rank must build the same model (a factory "
                           f"that depends on the rank, or files that differ between nodes?)")
                say(message)
                break
    return comm.bcast(message, root=0) is None


def _count(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
