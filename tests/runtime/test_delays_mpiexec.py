"""The master measures each message's turnaround: a run's injected delay comes back from its records."""

from __future__ import annotations

import numpy as np
import pytest

from pgc_mpi.core.message import MessageRecord
from pgc_mpi.runs.delays import measure

from helpers import run_train, steps_of

NOMINAL = 0.05


def test_an_injected_delay_is_measured_back_within_ten_percent(tmp_path):
    """dgd on 4 workers, 20 ms of compute and exp(50 ms) delays: what each worker took beyond its
    computation is its delay plus the way there and back on one host (the polls' sleeps, at most
    --poll-interval on each side, and the shared cores). Seed 4's draws over the measured steps
    average 49.8 ms, so the nominal mean is in reach as well as the drawn one."""
    out = tmp_path / "run"
    proc = run_train(5, ["--problem", "quadratic", "--scheme", "dgd", "--steps", "60", "--compute-time", "0.02",
                         "--delay", f"exp:{NOMINAL}", "--seed", "4", "--poll-interval", "0.0005",
                         "--eval-every", "1000", "--out", str(out)], timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    messages = [MessageRecord._make(m) for r in steps_of(out) for m in r["messages"]]
    assert all(m.turnaround > m.compute_time + m.delay for m in messages)  # the worker's own times lie inside it
    report = measure(out)
    assert report.overall.count == 4 * 55 and report.first_step == 5
    assert report.overall.mean == pytest.approx(report.injected_mean, rel=0.1)
    assert report.overall.mean == pytest.approx(NOMINAL, rel=0.1)
    beyond = np.array([e.extra - e.delay for e in report.extras])  # each message's own delay, matched
    assert np.median(beyond) < 5e-3, np.quantile(beyond, (0.5, 0.9, 1.0))
    assert report.fit.mean == pytest.approx(NOMINAL, rel=0.1) and not report.slow, report.describe()
