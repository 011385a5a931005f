"""How many workers a run that lost some starts again on (the launch scripts ask this after losses):

    python -m pgc_mpi.commands.restart_count --available N -- PGC-TRAIN-OPTIONS...
    python -m pgc_mpi.commands.restart_count --ranks R -- PGC-TRAIN-OPTIONS...

The options after `--` are read by pgc-train's own parser (its --config TOML file included), and
each count is checked by pgc-train's validation (pgc_mpi.config.restart). `--available N`: N
workers are left; `--ranks R`: R MPI ranks are left, the --servers among them. It prints the
largest count that fits, as workers (--available) or ranks (--ranks), on the first line, and
when that is fewer than are left, why on a second line; exit status 0. When no count fits: one
line of why and what to run instead, exit status 1. Options pgc-train's parser refuses (or a bad
TOML file): its error on stderr, exit status 2. Imports neither torch nor mpi4py (fast).
"""

from __future__ import annotations

import argparse
import sys

from ..config import config_from_args
from ..config.restart import restart_count
from ..errors import PgcError


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    """The command (see the module's docstring); returns its exit status."""
    argv = sys.argv[1:] if argv is None else argv
    ours, options = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog="python -m pgc_mpi.commands.restart_count",
        description="The largest worker count, at most those left, that a run's pgc-train options accept.",
        epilog="Give pgc-train's options after --, as pgc-train is given them.")
    left = parser.add_mutually_exclusive_group(required=True)
    left.add_argument("--available", type=_count, metavar="N", help="the workers left")
    left.add_argument("--ranks", type=_count, metavar="R", help="the MPI ranks left (the servers and the workers)")
    args = parser.parse_args(ours)
    try:
        cfg = config_from_args(options)  # argparse's errors exit with status 2, as pgc-train's do
    except PgcError as exc:  # a --config file that cannot be read, or with a wrong key
        print(f"restart_count: error: {exc}", file=sys.stderr)
        return 2
    ranks = args.ranks is not None
    # the servers of a --servers that is no count: validate refuses every count with the reason
    answer = restart_count(cfg, cfg.workers_of(args.ranks) if ranks else args.available)
    if answer.workers is None:
        print(answer.why)
        return 1
    print(answer.workers + cfg.servers if ranks else answer.workers)
    if answer.why:
        print(answer.why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
