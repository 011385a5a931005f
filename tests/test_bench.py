"""pgc-bench and pgc-plot: a tiny real experiment, figures computed from the metrics, bad files."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from pgc_mpi.bench import load_experiment, plan, run_options
from pgc_mpi.bench import main as bench
from pgc_mpi.errors import ConfigError
from pgc_mpi.message import MessageRecord
from pgc_mpi.metrics import read_metrics
from pgc_mpi.plot import main as plot
from pgc_mpi.results import realized_delays
from pgc_mpi.stragglers import DelayModel


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    exp = root / "exp.toml"
    exp.write_text('name = "tiny"\nworkers = 3\nschemes = ["dgd", "pgc-cr", "gc-fr"]\ns = [1]\n'
                   'target_loss = 1.9\ntimeout = 120\n[train]\nsteps = 12\neval-every = 4\ndelay = "exp:0.02"\n')
    assert bench([str(exp), "--out", str(root / "out")]) == 0
    return root / "out"


def test_the_table_is_computed_from_the_metrics(experiment):
    rows = {r["scheme"]: r for r in csv.DictReader((experiment / "results.csv").open())}
    assert set(rows) == {"dgd", "pgc-cr"}  # gc-fr cannot run on 3 workers with s=1 and is skipped
    medians = {}
    for scheme in rows:
        steps = [r for r in read_metrics(experiment / f"{scheme}-s1-seed0" / "metrics.jsonl") if "event" not in r]
        medians[scheme] = float(np.median([r["step_time"] for r in steps]))
        assert float(rows[scheme]["median_step_time"]) == pytest.approx(medians[scheme])
        wasted = sum(m.gradients for r in steps for m in map(MessageRecord._make, r["messages"]) if m.verdict != "used")
        assert int(rows[scheme]["wasted_gradients"]) == wasted
    assert float(rows["pgc-cr"]["step_time_vs_dgd"]) == pytest.approx(medians["pgc-cr"] / medians["dgd"])
    assert "| pgc-cr | 1 |" in (experiment / "results.md").read_text()


def test_figures_are_written_and_pgc_plot_redraws_them(experiment, tmp_path):
    for name in ("loss_vs_steps.png", "loss_vs_time.png", "step_times.png", "staleness.png"):
        assert (experiment / name).stat().st_size > 5000
    assert plot([str(experiment), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "loss_vs_time.png").stat().st_size > 5000
    assert plot([str(tmp_path / "nothing")]) == 2


def test_realized_delays_replay_the_run(experiment):
    config = json.loads((experiment / "pgc-cr-s1-seed0" / "config.json").read_text())["config"]
    model = DelayModel(config["delay"], 3, seed=config["seed"])
    trace = realized_delays(experiment / "pgc-cr-s1-seed0")
    assert len(trace) > 12
    assert all(d == pytest.approx(model.delay(w, s), abs=1e-12) for w, s, d in trace)


def test_bad_experiment_files(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('workers = 3\nschemes = ["dgd"]\ncolour = "red"\n')
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        load_experiment(f)
    f.write_text('workers = "three"\nschemes = ["dgd"]\n')
    with pytest.raises(ConfigError, match="'workers' must be a int"):
        load_experiment(f)
    f.write_text('workers = 3\nschemes = ["dgd"]\n[train]\nscheme = "gc-cr"\n')
    with pytest.raises(ConfigError, match="per-run options"):
        load_experiment(f)
    f.write_text('workers = 4\nschemes = ["dgd", "gc-fr", "nope"]\ns = [1, 2]\n')
    reasons = {(r[0], r[1]): r[3] for r in plan(load_experiment(f))}
    assert reasons[("dgd", 1)] is None and reasons[("gc-fr", 1)] is None
    assert "divisible" in reasons[("gc-fr", 2)] and "unknown scheme" in reasons[("nope", 1)]
    assert bench([str(tmp_path / "missing.toml")]) == 2


def test_per_scheme_options_apply_to_that_scheme_only(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('workers = 4\nschemes = ["dgd", "pgc-cr", "pbs", "is-gc-cr"]\ns = [1, 2]\n'
                 '[train]\nmax-staleness = "none"\n[per_scheme.pbs]\nreplication = 2\nc = 4\nadapt = true\n')
    exp = load_experiment(f)
    assert run_options(exp, "pbs", 1, 0) == {"max_staleness": "none", "replication": 2, "c": 4, "adapt": True,
                                             "scheme": "pbs", "stragglers": 1, "seed": 0}
    assert run_options(exp, "pgc-cr", 2, 0) == {"max_staleness": "none", "scheme": "pgc-cr", "stragglers": 2,
                                                "seed": 0}
    runs = {(r[0], r[1]): r[3] for r in plan(exp)}
    # dgd and pbs ignore s: one run per seed; every run is valid (is-gc-cr's c defaults to 2)
    assert sorted(runs) == [("dgd", 1), ("is-gc-cr", 1), ("is-gc-cr", 2), ("pbs", 1), ("pgc-cr", 1), ("pgc-cr", 2)]
    assert all(reason is None for reason in runs.values())
    f.write_text('workers = 4\nschemes = ["pbs"]\n[per_scheme.pbz]\nc = 4\n')
    with pytest.raises(ConfigError, match=r"\[per_scheme.pbz\]: unknown scheme"):
        load_experiment(f)
    f.write_text('workers = 4\nschemes = ["pbs"]\n[per_scheme.pbs]\nseed = 4\n')
    with pytest.raises(ConfigError, match=r"\[per_scheme.pbs\] has unknown or per-run options \['seed'\]"):
        load_experiment(f)
