"""A user's recipe in the simulator: --optimizer and --scheduler PATH:NAME build the same update as
pgc-train's master (pgc_mpi.learning.optim.make_update), so a factory equal to a built-in recipe
gives the built-in's trajectory, bit for bit; the errors are pgc-train's one-liners."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from pgc_mpi.config import SimConfig
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.problems import LeastSquares
from pgc_mpi.learning.torch_problem import load_problem
from pgc_mpi.sim.cli import main as sim_main
from pgc_mpi.sim.simulator import simulate

FACTORIES = textwrap.dedent('''
    import torch

    def nesterov(model):
        return torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9, nesterov=True)

    def halve_every_4(optimizer):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)

    def not_an_optimizer(model):
        return 3
''')


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    path = tmp_path_factory.mktemp("recipe") / "recipe.py"
    path.write_text(FACTORIES)
    return path


def test_a_factory_equal_to_a_built_in_recipe_gives_its_trajectory(recipe):
    problem = load_problem("digits", "logreg", 6, 16, seed=2, dtype="float64")
    base = dict(scheme="pgc-cr", workers=6, stragglers=1, steps=12, delay="exp:0.5", seed=2,
                staleness_correction="weights:0.5")
    built_in = simulate(SimConfig(**base, optimizer="nesterov", lr=0.3, lr_schedule="step",
                                  lr_milestones="4,8", lr_gamma=0.5), problem, record_params=True)
    yours = simulate(SimConfig(**base, optimizer=f"{recipe}:nesterov", scheduler=f"{recipe}:halve_every_4"),
                     problem, record_params=True)
    assert len(yours.trajectory) == 13
    assert all(np.array_equal(a, b) for a, b in zip(yours.trajectory, built_in.trajectory))
    assert [r["lr"] for r in yours.records] == [r["lr"] for r in built_in.records]


def test_the_errors_are_pgc_trains(recipe, capsys):
    with pytest.raises(ConfigError, match="returned int, not a torch.optim.Optimizer"):
        simulate(SimConfig(scheme="dgd", workers=6, steps=2, delay="none", optimizer=f"{recipe}:not_an_optimizer"),
                 load_problem("digits", "logreg", 6, 16, seed=2))
    with pytest.raises(ConfigError, match="a user's optimizer needs a torch model"):
        simulate(SimConfig(scheme="dgd", workers=6, steps=2, delay="none", optimizer=f"{recipe}:nesterov"),
                 LeastSquares(6, samples=60, dim=4, seed=1))
    with pytest.raises(ConfigError, match="both set the learning rate"):
        SimConfig(scheme="dgd", scheduler=f"{recipe}:halve_every_4", lr_schedule="cosine")
    with pytest.raises(ConfigError, match="is not PATH:NAME"):
        SimConfig(scheme="dgd", scheduler="cosine")
    assert sim_main(["--schemes", "dgd", "-n", "4", "--steps", "3", "--model", "logreg", "--dataset", "digits",
                     "--optimizer", f"{recipe}:no_such_factory"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "has no attribute 'no_such_factory'" in err[0], err
