"""`python -m pgc_mpi train|sim ...`: the same commands as pgc-train and pgc-sim."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the `train` or `sim` command."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("train", "sim"):
        print("usage: python -m pgc_mpi {train,sim} [options]   (see pgc-train --help, pgc-sim --help)",
              file=sys.stderr)
        return 2
    if argv[0] == "sim":
        from .sim.cli import main as command

        return command(argv[1:])
    from .job.entry import train

    sys.argv = [f"{sys.argv[0]} train", *argv[1:]]
    train()  # does not return: it finalizes MPI and exits
    return 0


if __name__ == "__main__":
    sys.exit(main())
