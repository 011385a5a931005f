"""`pgc-plot RUN_OR_BENCH_DIR...`: loss vs steps and vs wall time, step times, staleness and, for
pbs runs, the error decomposition (PNG)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .results import curve, load_run


def run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories (those with a metrics.jsonl) at or one level below each path."""
    found: list[Path] = []
    for p in paths:
        if (p / "metrics.jsonl").is_file():
            found.append(p)
        else:
            found.extend(sorted(d for d in p.glob("*/") if (d / "metrics.jsonl").is_file()))
    return found


def draw(runs: list[Path], out: Path) -> list[Path]:
    """Draw the four figures for these runs into `out`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    loaded = [(d.name, *load_run(d)) for d in runs]
    written = []
    for name, xlabel, index in (("loss_vs_steps.png", "step", 0), ("loss_vs_time.png", "wall time (s)", 1)):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, _, steps, evals in loaded:
            pts = curve(steps, evals)
            ax.plot(pts[index], pts[2], marker=".", label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training loss (full set)" if loaded and loaded[0][3] and "train_loss" in loaded[0][3][0]
                      else "test loss")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        written.append(out / name)
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(loaded)), 4.5))
    ax.boxplot([[r["step_time"] for r in steps] for _, _, steps, _ in loaded], showfliers=False)
    ax.set_xticks(range(1, len(loaded) + 1), [label for label, *_ in loaded], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("step time (s)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out / "step_times.png", dpi=120)
    plt.close(fig)
    written.append(out / "step_times.png")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, _, steps, _ in loaded:
        ages = [r["max_staleness"] for r in steps]
        ax.hist(ages, bins=range(0, max(ages, default=0) + 2), histtype="step", label=label)
    ax.set_xlabel("max staleness of a step's used buffers (steps)")
    ax.set_ylabel("steps")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "staleness.png", dpi=120)
    plt.close(fig)
    written.append(out / "staleness.png")
    tables = [(label, steps) for label, _, steps, _ in loaded if any("grad_norm_sq" in r for r in steps)]
    if tables:
        written.append(_draw_decomposition(plt, tables, out / "pbs_decomposition.png"))
    return written


def _draw_decomposition(plt, runs: list[tuple[str, list[dict]]], path: Path) -> Path:
    """pbs: ||g_hat||^2 per step against the stale-error bound L_hat^2 * displacement at each probe
    (pgc_mpi.diagnostics), and the mean squared displacement of the table's models."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
    for k, (label, steps) in enumerate(runs):
        color = f"C{k % 10}"
        top.plot([r["step"] for r in steps], [r["grad_norm_sq"] for r in steps], color=color, lw=0.8,
                 label=f"{label}: ||g_hat||^2")
        probes = [r for r in steps if "error_bound" in r]
        top.plot([r["step"] for r in probes], [r["error_bound"] for r in probes], color=color, ls="none",
                 marker="x", label=f"{label}: L_hat^2 x displacement")
        bottom.plot([r["step"] for r in steps], [r["displacement"] for r in steps], color=color, lw=0.8, label=label)
    top.set_yscale("log")
    top.set_ylabel("squared norm")
    top.legend(fontsize=7)
    top.grid(alpha=0.3)
    bottom.set_yscale("symlog", linthresh=1e-8)  # a step with every entry at w_t has displacement 0
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("step")
    bottom.set_ylabel("mean ||w_t - w_v||^2 over the table")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-plot`."""
    p = argparse.ArgumentParser(prog="pgc-plot", description=__doc__)
    p.add_argument("dirs", nargs="+", type=Path, help="run directories or pgc-bench output directories")
    p.add_argument("--out", type=Path, default=None, help="where the PNGs go (default: the first directory)")
    args = p.parse_args(argv)
    runs = run_dirs(args.dirs)
    if not runs:
        print(f"pgc-plot: error: no metrics.jsonl in or below {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 2
    for f in draw(runs, args.out or args.dirs[0]):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
