"""Minibatches loaded ahead by loader processes (pgc_mpi.learning.prefetch, minibatches): the same
bits as a minibatch read in place, whatever was expected, dropped or never asked for; a source that
raises, a loader that dies; the data wait."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.prefetch import Prefetcher
from pgc_mpi.learning.problems import Accumulated, expect_draws, take_data_wait
from pgc_mpi.learning.torch_problem import torch_problem

PARENT = os.getpid()


class Shifted(Dataset):
    """Random 8-sample-wide vectors, each read shifted by a random amount (torch's generator), and
    a failure mode: `raise_in` ('everywhere', 'loaders') or `die_in_loaders`; `sleep` per sample."""

    def __init__(self, n: int = 96, raise_in: str | None = None, die_in_loaders: bool = False, sleep: float = 0.0):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)
        self.raise_in, self.die_in_loaders, self.sleep, self.armed = raise_in, die_in_loaders, sleep, False

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        in_loader = os.getpid() != PARENT
        if self.armed and (self.raise_in == "everywhere" or (self.raise_in == "loaders" and in_loader)):
            raise ValueError(f"sample {i} is broken")
        if self.armed and self.die_in_loaders and in_loader:
            os._exit(3)
        time.sleep(self.sleep)
        return torch.roll(self.x[i], int(torch.randint(0, 8, ()))), int(self.y[i])


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def _problem(data: Dataset, loaders: int = 0, accumulate: int = 1):
    problem = torch_problem(make_model, data, workers=3, batch_size=8, seed=5, dtype="float64")
    assert problem.minibatches.start_loaders(loaders) == (loaders > 0)
    data.armed = True
    return Accumulated(problem, accumulate) if accumulate > 1 else problem


def _gradients(problem, plan) -> list[tuple[float, np.ndarray]]:
    """Follow `plan`: ('expect', draws) names what comes next, ('compute', (partition, draw)) computes."""
    w = problem.initial_params() + 0.1
    out = []
    for what, arg in plan:
        if what == "expect":
            expect_draws(problem, arg)
        else:
            out.append(problem.loss_and_grad(w, *arg))
    return out


# expected in order, one never asked for (read in place), one expected then dropped, one expected twice
PLAN = [("expect", [(0, 0), (1, 0), (0, 1)]), ("compute", (0, 0)), ("compute", (1, 0)), ("compute", (2, 7)),
        ("expect", [(0, 2), (2, 1), (2, 1)]), ("compute", (0, 1)), ("compute", (0, 2)), ("compute", (2, 1)),
        ("compute", (2, 1))]


@pytest.mark.parametrize("accumulate", [1, 3])
def test_a_prefetched_minibatch_gives_the_bits_of_one_read_in_place(accumulate):
    """Random transforms and dropout included: the loader reads with the generator seeded as the
    worker would, and the worker continues from the generator's state after that read."""
    expected = _gradients(_problem(Shifted(), accumulate=accumulate), PLAN)
    problem = _problem(Shifted(), loaders=2, accumulate=accumulate)
    got = _gradients(problem, PLAN)
    assert problem.minibatches.loader.active
    for (loss, grad), (want_loss, want) in zip(got, expected, strict=True):
        assert loss == want_loss and np.array_equal(grad, want)
    assert not np.array_equal(expected[0][1], expected[3][1])  # the draws differ: the comparison can fail
    problem.minibatches.close()


def test_the_loaders_hold_only_what_was_expected_last():
    problem = _problem(Shifted(), loaders=2)
    problem.expect([(0, 0), (0, 1), (1, 0)])
    assert problem.minibatches.loader.held() == 3
    problem.expect([(1, 0), (2, 0)])  # (0, 0) and (0, 1) are dropped: a straggler's skipped steps
    assert problem.minibatches.loader.held() == 2
    assert problem.minibatches.loader.take((0, 0)) is None  # dropped: the worker reads it itself
    problem.minibatches.close()


def test_a_source_that_raises_ends_with_the_one_line_error_naming_the_samples(caplog):
    problem = _problem(Shifted(raise_in="everywhere"), loaders=2)
    problem.expect([(0, 0)])
    with caplog.at_level(logging.WARNING, "pgc_mpi"), pytest.raises(ConfigError, match=r"train_data: reading "
                                                                    r"samples \[\d+, \d+, \d+\]\.\.\. failed: "
                                                                    r"ValueError: sample \d+ is broken"):
        problem.loss_and_grad(problem.initial_params(), 0, 0)
    assert "a loader raised ConfigError: train_data: reading samples" in caplog.text
    assert not problem.minibatches.loader.active


@pytest.mark.parametrize("failure", ["raise_in_loaders", "die_in_loaders"])
def test_loaders_that_fail_are_reported_and_the_worker_reads_on_itself(caplog, failure):
    """A loader process that dies (or a source that only fails in one: forked handles) is not hung
    on: one warning, and the same gradients from the worker's own reads."""
    data = Shifted(raise_in="loaders") if failure == "raise_in_loaders" else Shifted(die_in_loaders=True)
    expected = _gradients(_problem(Shifted()), PLAN)
    problem = _problem(data, loaders=2)
    with caplog.at_level(logging.WARNING, "pgc_mpi"):
        got = _gradients(problem, PLAN)
    assert all(np.array_equal(g, e) for (_, g), (_, e) in zip(got, expected, strict=True))
    why = "a loader raised ConfigError" if failure == "raise_in_loaders" else "a loader process died"
    assert caplog.text.count(why) == 1 and "reads its minibatches itself from now on" in caplog.text
    assert not problem.minibatches.loader.active


def test_the_data_wait_is_what_getting_the_minibatches_took():
    problem = _problem(Shifted(sleep=0.002))
    assert take_data_wait(problem) == 0.0
    problem.loss_and_grad(problem.initial_params(), 0, 0)
    assert take_data_wait(problem) >= 8 * 0.002  # eight samples read in place, each sleeping 2 ms
    assert take_data_wait(problem) == 0.0  # taken: it counts once
    held = torch_problem(make_model, (np.zeros((30, 8)), np.zeros(30, dtype=np.int64)), workers=3, batch_size=8)
    assert held.minibatches.start_loaders(2) is False  # arrays are held: a minibatch is a slice, nothing to load
    held.loss_and_grad(held.initial_params(), 0, 0)
    assert take_data_wait(held) == 0.0  # slicing held rows is computation, not a wait for data


@pytest.mark.parametrize("worth,starts", [(None, True), (60.0, False)])
def test_auto_starts_loaders_only_where_the_first_reads_are_slow(monkeypatch, worth, starts):
    """--loader-workers auto: TRIAL_READS minibatches read in place; loaders start where their
    median read took WORTH_LOADING or more (eight samples of at least 1 ms each: over the default
    2 ms; not over a minute), and the gradients are the same bits either way."""
    from pgc_mpi.learning import minibatches

    assert minibatches.WORTH_LOADING == 0.002
    if worth is not None:
        monkeypatch.setattr(minibatches, "WORTH_LOADING", worth)
    plan = [("expect", [(0, d)]) if k % 2 == 0 else ("compute", (0, d)) for d in range(minibatches.TRIAL_READS + 2)
            for k in range(2)]
    expected = _gradients(_problem(Shifted(sleep=0.001)), plan)
    problem = torch_problem(make_model, Shifted(sleep=0.001), workers=3, batch_size=8, seed=5, dtype="float64")
    assert problem.minibatches.start_loaders(2, when_slow=True) and problem.minibatches.loads_ahead
    got = _gradients(problem, plan)
    assert all(np.array_equal(g, e) for (_, g), (_, e) in zip(got, expected, strict=True))
    assert (problem.minibatches.loader is not None) == starts and problem.minibatches.loads_ahead == starts
    problem.minibatches.close()


def test_a_prefetcher_loads_in_the_order_asked_and_gives_up_cleanly():
    loader = Prefetcher(lambda key: (key, os.getpid()), workers=2)
    loader.expect(["a", "b", "b", "c"])
    assert loader.held() == 3
    (key, pid) = loader.take("b")
    assert key == "b" and pid != os.getpid()  # loaded in a loader process
    assert loader.take("b") is None  # taken once
    loader.close()
    assert loader.take("a") is None and loader.held() == 0
    with pytest.raises(ValueError, match="at least one loader process"):
        Prefetcher(lambda key: key, workers=0)
