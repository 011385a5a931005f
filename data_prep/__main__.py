"""`python -m data_prep`: convert data sets to pgc-mpi's HDF5 layout (see pgc_mpi/h5format.py)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from pgc_mpi.errors import PgcError
from pgc_mpi.learning.datasets import digits_arrays, split_train_test
from pgc_mpi.learning.h5format import verify_checksum, write_dataset

from .cifar import read_cifar10
from .idx import read_idx_pair
from .synthetic import KINDS, make_synthetic

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist package
IDX_NAMES = {"train_images": "train-images-idx3-ubyte.gz", "train_labels": "train-labels-idx1-ubyte.gz",
             "test_images": "t10k-images-idx3-ubyte.gz", "test_labels": "t10k-labels-idx1-ubyte.gz"}


def normalize(train: np.ndarray, test: np.ndarray, max_value: float, how: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """Scale raw pixels to 0..1 ('unit'), then optionally standardize per channel with the
    training split's mean and std ('standard'); returns the arrays and the recipe."""
    scale = 1.0 / max_value
    train = train.astype(np.float32) * scale
    test = test.astype(np.float32) * scale
    recipe: dict = {"method": how, "scale": scale}
    if how == "standard":
        axes = (0, 2, 3) if train.ndim == 4 else (0,)
        mean = train.mean(axis=axes, keepdims=True)
        std = train.std(axis=axes, keepdims=True) + 1e-8
        train, test = (train - mean) / std, (test - mean) / std
        recipe.update(mean=mean.ravel().tolist(), std=std.ravel().tolist())
    return train, test, recipe


def _digits(args: argparse.Namespace) -> Path:
    x, y = digits_arrays()
    train, test = split_train_test(len(y), args.seed)
    xtr, xte, recipe = normalize(x[train], x[test], 16.0, args.normalize)
    recipe["split"] = f"seeded 80/20, seed {args.seed}"
    return write_dataset(args.out or Path("digits.h5"), "digits", (xtr, y[train]), (xte, y[test]), 10,
                         "scikit-learn datasets/data/digits.csv.gz", recipe)


def _idx(args: argparse.Namespace, name: str, directory: Path | None) -> Path:
    files = {k: getattr(args, k) or (directory / v if directory else None) for k, v in IDX_NAMES.items()}
    missing = [f"--{k.replace('_', '-')}" for k, v in files.items() if v is None]
    if missing:
        raise PgcError(f"give --dir or all of {', '.join(missing)}")
    xtr, ytr = read_idx_pair(files["train_images"], files["train_labels"])
    xte, yte = read_idx_pair(files["test_images"], files["test_labels"])
    classes = int(max(ytr.max(), yte.max())) + 1
    xtr, xte, recipe = normalize(xtr, xte, 255.0, args.normalize)
    source = ", ".join(str(files[k]) for k in IDX_NAMES)
    return write_dataset(args.out or Path(f"{name}.h5"), name, (xtr, ytr), (xte, yte), classes, source, recipe)


def _cifar10(args: argparse.Namespace) -> Path:
    (xtr, ytr), (xte, yte) = read_cifar10(args.archive)
    xtr, xte, recipe = normalize(xtr, xte, 255.0, args.normalize)
    return write_dataset(args.out or Path("cifar10.h5"), "cifar10", (xtr, ytr), (xte, yte), 10,
                         str(args.archive), recipe)


def _synthetic(args: argparse.Namespace) -> Path:
    if args.samples < 2 or args.features < 1 or args.classes < 2:
        raise PgcError("--samples must be >= 2, --features >= 1 and --classes >= 2")
    x, y, classes, task = make_synthetic(args.kind, args.samples, args.features, args.classes, args.seed)
    train, test = split_train_test(len(y), args.seed)
    source = f"data_prep synthetic --kind {args.kind} --samples {args.samples} --features {args.features} " \
             f"--classes {args.classes} --seed {args.seed}"
    return write_dataset(args.out or Path(f"synthetic-{args.kind}.h5"), f"synthetic-{args.kind}",
                         (x[train], y[train]), (x[test], y[test]), classes, source,
                         {"method": "none (standard normal features)"}, task=task)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_prep", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str, images: bool = True) -> argparse.ArgumentParser:
        q = sub.add_parser(name, help=help_text, description=help_text)
        q.add_argument("--out", type=Path, default=None, help=f"output HDF5 file (default: {name}.h5)")
        if images:
            q.add_argument("--normalize", choices=("standard", "unit"), default="standard",
                           help="unit: pixels scaled to 0..1; standard: then per-channel mean 0, std 1 "
                                "(training split's statistics, recorded in the file) (default: %(default)s)")
        return q

    q = add("digits", "scikit-learn's 8x8 digits (ships in its wheel): the small built-in default")
    q.add_argument("--seed", type=int, default=0, help="seed of the 80/20 split (default: %(default)s)")
    for name, help_text in (("idx", "any MNIST-format gzipped IDX image/label pair (e.g. the official MNIST files)"),
                            ("fashion-mnist", f"Fashion-MNIST from Debian's dataset-fashion-mnist ({FASHION_DIR})")):
        q = add(name, help_text)
        q.add_argument("--dir", type=Path, default=FASHION_DIR if name == "fashion-mnist" else None,
                       help=f"directory with the four standard file names ({', '.join(IDX_NAMES.values())})")
        q.add_argument("--name", default=name, help="data set name stored in the file (default: %(default)s)")
        for key in IDX_NAMES:
            q.add_argument("--" + key.replace("_", "-"), type=Path, default=None, help="this file instead of DIR's")
    q = add("cifar10", "the official cifar-10-python.tar.gz you downloaded")
    q.add_argument("archive", type=Path, help="path to cifar-10-python.tar.gz")
    q = add("synthetic", "seeded synthetic sets: least squares, logistic, non-convex classification", images=False)
    q.add_argument("--kind", choices=KINDS, default="logistic")
    q.add_argument("--samples", type=int, default=10_000)
    q.add_argument("--features", type=int, default=20)
    q.add_argument("--classes", type=int, default=10, help="classes of the nonconvex kind (default: %(default)s)")
    q.add_argument("--seed", type=int, default=0)
    q = sub.add_parser("verify", help="check a data file as pgc-train opens it (layout, labels, finite "
                                      "values) and recompute its checksum")
    q.add_argument("file", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m data_prep`."""
    args = build_parser().parse_args(argv)
    began = time.perf_counter()
    try:
        if args.command == "verify":
            print(f"{args.file}: ok, checksum {verify_checksum(args.file)}")
            return 0
        if args.command == "digits":
            out = _digits(args)
        elif args.command in ("idx", "fashion-mnist"):
            out = _idx(args, args.name, args.dir)
        elif args.command == "cifar10":
            out = _cifar10(args)
        else:
            out = _synthetic(args)
    except PgcError as exc:
        print(f"data_prep {args.command}: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out} in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
