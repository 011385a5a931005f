"""`pgc-plot RUN_OR_BENCH_DIR...`: loss vs steps and vs wall time, step times, staleness and, for
pbs runs, the error decomposition (PNG)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import RunDataError
from ..runs.results import curve, load_run, lost_detail_note

# matplotlib is optional (the [plot] extra): pgc-plot refuses to start without it, pgc-bench skips
# its figures; either says so in one line with this command.
PLOT_EXTRA = "pip install 'pgc-mpi[plot]'"


def have_matplotlib() -> bool:
    """Whether matplotlib is installed (found, not imported: that takes a second)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories (those with a metrics.jsonl) at or one level below each path."""
    found: list[Path] = []
    for p in paths:
        if (p / "metrics.jsonl").is_file():
            found.append(p)
        else:
            found.extend(sorted(d for d in p.glob("*/") if (d / "metrics.jsonl").is_file()))
    return found


# One colour per scheme (never shared: the baselines dark, the pipelined schemes warm) and one
# line style per s.
SCHEME_COLORS = {"dgd": "black", "is-sgd": "tab:gray", "gc-fr": "tab:blue", "gc-cr": "tab:cyan",
                 "is-gc-fr": "tab:olive", "is-gc-cr": "tab:brown", "pgc-fr": "tab:red", "pgc-cr": "tab:orange",
                 "pbs": "tab:purple", "ddp": "tab:green"}
LINE_STYLES = ("-", "--", ":", "-.")


def _color(scheme: str) -> str:
    """The scheme's own colour (tab:pink for a scheme this module does not know)."""
    return SCHEME_COLORS.get(scheme, "tab:pink")


def _style(config: dict, all_s: list[int]) -> dict:
    """Colour by scheme, line style by s."""
    cfg = config["config"]
    s = cfg.get("stragglers", 0)
    return {"color": _color(cfg["scheme"]), "ls": LINE_STYLES[all_s.index(s) % len(LINE_STYLES)] if s in all_s else "-"}


def _title(loaded: list[tuple]) -> str:
    """What the runs share: data set and model (or synthetic problem), workers, delay models and seeds."""
    configs = [c for _, c, *_ in loaded]
    datasets = sorted({str(c["config"].get("dataset") or f"{c['config'].get('problem')} problem") for c in configs})
    models = sorted({str(c["config"].get("model") or f"dim {c['config'].get('dim')}") for c in configs})
    workers = sorted({str(c.get("workers")) for c in configs})
    delays = sorted({str(c["config"].get("delay")) for c in configs})
    seeds = sorted({c["config"].get("seed") for c in configs})
    return (f"{'/'.join(datasets)}, {'/'.join(models)}, {'/'.join(workers)} workers, delay {' | '.join(delays)}, "
            f"seeds {seeds}")


def draw(runs: list[Path], out: Path, target: float | None = None) -> list[Path]:
    """Draw the figures for these runs into `out` (`target`: a loss drawn as a line); returns the
    files written. Runs that did not complete are drawn too, marked with an x at their end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    loaded = _load_runs(runs)
    all_s = sorted({c["config"].get("stragglers", 0) for _, c, *_ in loaded})
    title = _title(loaded) if loaded else ""
    written = [_draw_loss(plt, loaded, all_s, title, out / name, xlabel, index, target)
               for name, xlabel, index in (("loss_vs_steps.png", "step", 0), ("loss_vs_time.png", "wall time (s)", 1))]
    written.append(_draw_step_times(plt, loaded, title, out / "step_times.png"))
    written.append(_draw_staleness(plt, loaded, all_s, title, out / "staleness.png"))
    tables = [(label, steps) for label, _, steps, _, _ in loaded if any("grad_norm_sq" in r for r in steps)]
    if tables:
        written.append(_draw_decomposition(plt, tables, out / "pbs_decomposition.png"))
    return written


def _load_runs(runs: list[Path]) -> list[tuple]:
    """(name, config, steps, evals, status) of every run that can be read; a run that cannot is
    skipped with a line on stderr (RunDataError when none can), and so is said of a run whose
    per-message detail is partly lost."""
    loaded, unreadable = [], []
    for d in runs:
        try:
            loaded.append((d.name, *load_run(d)))
        except RunDataError as exc:  # a damaged config.json: the other runs are still drawn
            unreadable.append(str(exc))
    if unreadable and not loaded:
        more = f" (and {len(unreadable) - 1} more runs that cannot be read)" if len(unreadable) > 1 else ""
        raise RunDataError(unreadable[0] + more)
    for why in unreadable:
        print(f"pgc-plot: skipping a run: {why}", file=sys.stderr)
    for name, _, steps, _, _ in loaded:
        note = lost_detail_note(name, steps)
        if note:
            print(f"pgc-plot: {note}", file=sys.stderr)
    return loaded


def _draw_loss(plt, loaded: list[tuple], all_s: list[int], title: str, path: Path, xlabel: str, index: int,
               target: float | None) -> Path:
    """The runs' loss against the step (`index` 0) or the wall time (1), each run's end marked with
    an x when it did not complete."""
    fig, ax = plt.subplots(figsize=(8, 5))
    labelled: set[str] = set()
    for _, config, steps, evals, status in loaded:
        pts = curve(steps, evals)
        style = _style(config, all_s)
        key = f"{config['config']['scheme']} s={config['config'].get('stragglers')}"
        ax.plot(pts[index], pts[2], lw=1, label=None if key in labelled else key, **style)
        labelled.add(key)
        if status != "completed" and pts[index]:
            ax.plot(pts[index][-1], pts[2][-1], marker="x", ms=9, color=style["color"])
    if target is not None:
        ax.axhline(target, color="black", lw=0.8, ls=(0, (1, 3)), label=f"target {target:g}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("training loss (full set)" if loaded and loaded[0][3] and "train_loss" in loaded[0][3][0]
                  else "test loss")
    ax.set_yscale("log")
    ax.set_title(title + ("  (x: run did not complete)" if any(r[4] != "completed" for r in loaded) else ""),
                 fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(plt, fig, path)


def _draw_step_times(plt, loaded: list[tuple], title: str, path: Path) -> Path:
    """A box plot of each run's step times."""
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(loaded)), 4.5))
    ax.boxplot([[r["step_time"] for r in steps] for _, _, steps, _, _ in loaded], showfliers=False)
    ax.set_xticks(range(1, len(loaded) + 1), [label for label, *_ in loaded], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("step time (s)")
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path)


def _draw_staleness(plt, loaded: list[tuple], all_s: list[int], title: str, path: Path) -> Path:
    """A histogram per run of its steps' max staleness."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, config, steps, _, _ in loaded:
        ages = [r["max_staleness"] for r in steps]
        ax.hist(ages, bins=range(0, max(ages, default=0) + 2), histtype="step", label=label, **_style(config, all_s))
    ax.set_xlabel("max staleness of a step's used buffers (steps)")
    ax.set_ylabel("steps")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> Path:
    """Write a finished figure as a PNG and free it (pyplot keeps every open figure)."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def draw_ratios(rows: list[dict], out: Path, title: str) -> Path:
    """Time to target relative to dgd (mean and 95% interval over seeds, paired by seed), one
    panel per delay model and s: pgc-bench's aggregated rows (bench.aggregate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    delays = list(dict.fromkeys(r["delay"] for r in rows))
    all_s = sorted({r["s"] for r in rows if r["s"] != "-"}) or ["-"]
    fig, axes = plt.subplots(len(delays), len(all_s), figsize=(max(5, 3.8 * len(all_s)), 3.6 * len(delays)),
                             squeeze=False)
    for ax, (delay, s) in zip(axes.flat, [(d, s) for d in delays for s in all_s]):  # a row per delay model
        chosen = [r for r in rows if r["delay"] == delay and r["s"] in (s, "-") and r["scheme"] != "dgd"]
        means = [r["time_vs_dgd"].mean for r in chosen]
        errors = [[m - r["time_vs_dgd"].low if r["time_vs_dgd"].k > 1 else 0 for m, r in zip(means, chosen)],
                  [r["time_vs_dgd"].high - m if r["time_vs_dgd"].k > 1 else 0 for m, r in zip(means, chosen)]]
        ax.bar(range(len(chosen)), means, yerr=errors, color=[_color(r["scheme"]) for r in chosen], capsize=3)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(range(len(chosen)), [r["scheme"] for r in chosen], rotation=45, ha="right", fontsize=7)
        ax.set_title(f"delay {delay}, s = {s}", fontsize=8)
        ax.set_ylabel("time to target / dgd's (same seed)")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=8)
    return _save(plt, fig, out / "time_vs_dgd.png")


def _draw_decomposition(plt, runs: list[tuple[str, list[dict]]], path: Path) -> Path:
    """pbs: ||g_hat||^2 per step against the stale-error bound L_hat^2 * displacement at each probe
    (pgc_mpi.learning.diagnostics), and the mean squared displacement of the table's models."""
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
    return _save(plt, fig, path)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-plot`."""
    p = argparse.ArgumentParser(prog="pgc-plot", description=__doc__)
    p.add_argument("dirs", nargs="+", type=Path, help="run directories or pgc-bench output directories")
    p.add_argument("--out", type=Path, default=None, help="where the PNGs go (default: the first directory)")
    args = p.parse_args(argv)
    if not have_matplotlib():
        print(f"pgc-plot needs matplotlib: {PLOT_EXTRA}", file=sys.stderr)
        return 2
    runs = run_dirs(args.dirs)
    if not runs:
        print(f"pgc-plot: error: no metrics.jsonl in or below {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 2
    try:
        files = draw(runs, args.out or args.dirs[0])
    except RunDataError as exc:
        print(f"pgc-plot: error: {exc}", file=sys.stderr)
        return 2
    for f in files:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
