"""Minibatches loaded ahead under mpiexec (bounded; 5 ranks, a small Dataset with a random transform
and a dropout model, few steps): the MPI run with loader processes equals its replay in one process
without them (float64, to 1e-10), stragglers' mispredicted jobs included; every message says how
long its worker waited for data; a loader that dies is reported and the run completes."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from pgc_mpi.core.message import MessageRecord
from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.learning.problems import Accumulated
from pgc_mpi.learning.torch_problem import torch_problem
from pgc_mpi.sim.replaying import replay

from helpers import events_of, run_mpi, steps_of

# argv: OUT, then fit's options as JSON. DIE=1 in the options' "die": loader processes die.
FIT_SCRIPT = '''
import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset

import pgc_mpi


class Shifted(Dataset):
    """Fixed random vectors, each read rolled by a random amount; 1 ms a sample."""

    def __init__(self, n, seed, die=False):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
        self.die, self.rank_pid = die, None

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if self.die and self.rank_pid is not None and os.getpid() != self.rank_pid:
            os._exit(9)
        time.sleep(0.001)
        return torch.roll(self.x[i], int(torch.randint(0, 8, ()))), int(self.y[i])


def make_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


if __name__ == "__main__":
    options = json.loads(sys.argv[2])
    train = Shifted(96, 0, die=options.pop("die", False))
    train.rank_pid = os.getpid()  # the rank itself reads; its loader processes (forked) are others
    pgc_mpi.fit(make_model, train, test_data=Shifted(24, 1), batch_size=8, eval_every=100, seed=3,
                out=sys.argv[1], **options)
'''


def _fit(tmp_path, **options):
    script = tmp_path / "fit_shifted.py"
    script.write_text(FIT_SCRIPT)
    out = tmp_path / "run"
    proc = run_mpi(5, [str(script), str(out), json.dumps(options)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def _script_module(tmp_path):
    spec = importlib.util.spec_from_file_location("fit_shifted", tmp_path / "fit_shifted.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fit_shifted"] = module
    spec.loader.exec_module(module)
    return module


ABANDONING = {"abandon_late": True, "accumulate": 2, "compute_time": 0.05, "delay": "exp:0.1"}


@pytest.mark.parametrize("scheme,options", [("gc-cr", {}), ("pgc-cr", ABANDONING)], ids=["gc-cr", "pgc-cr-abandoning"])
def test_a_run_with_loaders_equals_its_replay_without_them(tmp_path, scheme, options):
    """A 0.4 s straggler makes its worker skip steps (or, with --abandon-late, stragglers drop
    decided jobs): the minibatches loaded for the jobs it never computes are dropped, and it reads
    the ones it needs. Decoding stays exact (gc-cr's holders agree) and the trajectory is the one
    computed without loaders."""
    steps = 16
    out, _ = _fit(tmp_path, scheme=scheme, stragglers=1, steps=steps, dtype="float64", lr=0.5, record_params=True,
                  loader_workers=2, prefetch=2, grace=5, **({"delay": "random:1:0.4"} | options))
    mine = _script_module(tmp_path)
    problem = torch_problem(mine.make_model, mine.Shifted(96, 0), workers=4, batch_size=8, seed=3, dtype="float64")
    if options:
        problem = Accumulated(problem, options["accumulate"])
        assert sum(r["abandoned"] for r in steps_of(out)) >= 1
    expected = replay(make_scheme(scheme, 4, 1, seed=3), problem, steps_of(out), lr=0.5)
    got = np.load(out / "params.npy")
    assert got.shape == (steps + 1, problem.dim)
    assert np.abs(got - np.stack(expected)).max() < 1e-10
    assert np.abs(got[-1] - got[0]).max() > 1e-3  # it did train
    records = [MessageRecord._make(m) for r in steps_of(out) for m in r["messages"] if m[5] != "rejected"]
    waits = [m.data_wait for m in records]
    assert all(w is not None and 0 <= w <= m.compute_time for w, m in zip(waits, records)), waits
    assert json.loads((out / "config.json").read_text())["config"]["loader_workers"] == 2
    jobs = {w: sorted({m.step for m in records if m.worker == w}) for w in range(4)}
    assert any(np.diff(s).max() > 1 for s in jobs.values()), jobs  # a worker skipped steps: loads were dropped


def test_a_loader_that_dies_is_reported_and_the_run_completes(tmp_path):
    out, proc = _fit(tmp_path, scheme="pbs", steps=10, loader_workers=1, die=True)
    assert events_of(out, "summary")[0]["status"] == "completed"
    assert "a loader process died" in proc.stderr and "reads its minibatches itself from now on" in proc.stderr
