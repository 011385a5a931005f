"""The experiment files shipped in experiments/: each one loads and plans (no run is launched), so
that none is broken by a change of pgc-bench's or pgc-train's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgc_mpi.choices import BUILTIN_DATASETS
from pgc_mpi.commands.bench import load_experiment, plan

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.toml"))


def test_there_are_experiments():
    assert "digits.toml" in [p.name for p in EXPERIMENTS]


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.name for p in EXPERIMENTS])
def test_experiment_loads_and_every_run_is_valid(path):
    exp = load_experiment(path)
    runs = plan(exp)
    assert runs, f"{path.name} plans no run"
    assert [(key, reason) for key, reason in runs if reason is not None] == []


def test_digits_is_a_quick_comparison():
    """The README's first-screen comparison: built-in data (no preparation, no download), MPI,
    a target, dgd as the reference, and few short runs (its duration is measured, not tested)."""
    exp = load_experiment(ROOT / "experiments" / "digits.toml")
    runs = plan(exp)
    assert exp["train"]["dataset"] in BUILTIN_DATASETS
    assert exp["backend"] == "mpi"
    assert exp["target_loss"] is not None
    assert "dgd" in exp["schemes"]
    assert len(runs) <= 8
    assert exp["workers"] <= 4
    assert exp["train"]["steps"] <= 60
