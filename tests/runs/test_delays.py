"""pgc_mpi.runs.delays: what each worker took beyond its computation, from records built here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pgc_mpi.core.message import MessageRecord
from pgc_mpi.core.stragglers import DelayModel
from pgc_mpi.errors import ConfigError
from pgc_mpi.runs.delays import (
    SLOW_RATIO,
    Extra,
    extras,
    fit_delay,
    load_steps,
    measure,
    summarize,
    write_trace,
)
from pgc_mpi.runs.metrics import MetricsWriter, _plain

COMPUTE = 0.02


def _records(extra, n: int = 4, steps: int = 60, first: int = 0) -> list[dict]:
    """Coded-scheme step records: every worker's message for every step, with turnaround =
    compute_time + extra(worker, step) and its injected delay the same extra; step 10 also has a
    rejected message."""
    records = []
    for t in range(first, first + steps):
        messages = [MessageRecord(w, t, extra(w, t), COMPUTE, 1, "used", COMPUTE / 2, COMPUTE + extra(w, t))
                    for w in range(n)]
        if t == first + 10:
            messages.append(MessageRecord.rejected(1))
        records.append({"step": t, "wall_time": 0.1 * t, "arrivals": list(range(n)), "used": list(range(n)),
                        "messages": messages, "versions": {w: [t] for w in range(n)}})
    return records


def _exp(mean: float, seed: int = 0, slow: dict[int, float] | None = None):
    """extra(worker, step): seeded exponential draws, plus a constant for `slow` workers."""
    rng = np.random.default_rng(seed)
    table = rng.exponential(mean, size=(16, 1000))
    return lambda w, t: float(table[w, t]) + (slow or {}).get(w, 0.0)


def test_extra_is_turnaround_less_compute_past_the_warm_up():
    records = _records(_exp(0.05), steps=30, first=7)  # a resumed run: it starts at step 7
    found = extras(records, warmup=5)
    assert {e.step for e in found} == set(range(12, 37)) and len(found) == 4 * 25  # the rejected one left out
    for e in found:
        assert e.extra == pytest.approx(_exp(0.05)(e.worker, e.step), abs=1e-12) == e.delay
    assert len(extras(records, warmup=0)) == 4 * 30


def test_a_summary_per_worker_and_overall():
    extra = _exp(0.05, seed=1)
    report = summarize(extras(_records(extra, steps=400)), first_step=5)
    x = np.array([extra(w, t) for t in range(5, 400) for w in range(4)])
    assert report.overall.count == len(x) and report.overall.mean == pytest.approx(x.mean())
    assert report.overall.median == pytest.approx(np.median(x)) and report.max == pytest.approx(x.max())
    assert report.overall.p99 == pytest.approx(np.quantile(x, 0.99)) and report.std == pytest.approx(x.std())
    assert report.injected_mean == pytest.approx(x.mean())
    assert 3.5 < report.tail < 5.5  # an exponential's p99 is 4.6 times its mean
    assert [w.worker for w in report.workers] == [0, 1, 2, 3]
    for w in report.workers:
        mine = np.array([extra(w.worker, t) for t in range(5, 400)])
        assert w.spread.count == 395 and w.spread.mean == pytest.approx(mine.mean())
        assert w.spread.p90 == pytest.approx(np.quantile(mine, 0.9)) and not w.slow and 0.7 < w.ratio < 1.4
    assert not report.slow and not report.correlated
    assert report.fit.family == "exp" and float(report.fit.spec[4:]) == pytest.approx(x.mean(), rel=1e-3)
    assert DelayModel(report.fit.spec, 4).active
    assert "worker 3: 395 messages" in report.describe()


def test_a_persistently_slow_worker_is_found_and_fitted_as_a_fixed_term():
    report = summarize(extras(_records(_exp(0.05, seed=2, slow={2: 0.3}), n=6, steps=300)))
    assert list(report.slow) == [2] and report.slow[2] == pytest.approx(0.3, rel=0.1)
    slow = next(w for w in report.workers if w.worker == 2)
    assert slow.slow and slow.ratio > SLOW_RATIO and slow.spread.median > 0.3
    assert report.fit.spec.startswith("fixed:2:") and "+" in report.fit.spec
    fixed, base = report.fit.spec.split("+")
    assert float(fixed.split(":")[2]) == pytest.approx(0.3, rel=0.1)
    model = DelayModel(report.fit.spec, 6)  # a spec --delay takes
    assert model.spec == report.fit.spec and base.split(":")[0] in ("exp", "shiftexp", "lognormal")


def test_a_worker_a_little_slower_or_noise_near_zero_is_not_slow():
    # 1.5 times the others: under the ratio; 3 times the others, but 0.2 ms: communication noise
    for extra in (_exp(0.05, seed=3, slow={1: 0.025}), lambda w, t: 3e-4 if w == 0 else 1e-4):
        report = summarize(extras(_records(extra, steps=200)))
        assert not report.slow and not any(w.slow for w in report.workers)


def test_records_written_before_turnaround_count_for_nothing():
    old = [{**r, "messages": [list(m[:6]) if m.worker % 2 else list(m[:7]) for m in r["messages"]]}
           for r in _records(_exp(0.05), steps=20)]
    assert extras(old) == []
    with pytest.raises(ConfigError, match="no message past the first 5 steps has a turnaround"):
        summarize(extras(old))
    mixed = old[:10] + _records(_exp(0.05), steps=10, first=10)  # a run resumed by a newer pgc-mpi
    assert {e.step for e in extras(mixed)} == set(range(10, 20))
    json_form = json.loads(json.dumps(_plain(_records(_exp(0.05), steps=8))))  # None for NaN, as read back
    assert len(extras(json_form)) == 4 * 3


def test_correlation_in_time_is_told_apart():
    rng = np.random.default_rng(4)
    bursts = np.repeat(rng.random((4, 40)) < 0.3, 10, axis=1) * 0.5  # slow for 10 steps at a time
    bursty = summarize(extras(_records(lambda w, t: 0.01 + float(bursts[w, t]), steps=400)))
    assert bursty.correlated and bursty.lag1 > 0.5
    assert all(w.lag1 > 0.5 for w in bursty.workers)
    independent = summarize(extras(_records(_exp(0.05, seed=5), steps=400)))
    assert not independent.correlated and abs(independent.lag1) < independent.lag1_threshold


def test_the_trace_round_trips_through_the_delay_model(tmp_path):
    extra = _exp(0.05, seed=6)
    found = extras(_records(extra, steps=40))
    path = tmp_path / "trace.csv"
    assert write_trace(found, path) == 4 * 35
    model = DelayModel(f"trace:{path}", 4)
    for e in found:
        assert model.delay(e.worker, e.step) == e.extra  # exactly: the CSV holds every digit
    assert model.delay(0, 0) == 0.0  # the warm-up steps are not in it
    write_trace(found, path, rebase=True)  # numbered from 0
    model = DelayModel(f"trace:{path}", 4)
    assert all(model.delay(e.worker, e.step - 5) == e.extra for e in found)
    # pbs: a worker's several messages at one model replay as their mean; clock noise as 0
    write_trace([Extra(0, 7, 0.1, 0.0), Extra(0, 7, 0.3, 0.0), Extra(1, 7, -1e-6, 0.0)], path)
    model = DelayModel(f"trace:{path}", 2)
    assert model.delay(0, 7) == pytest.approx(0.2) and model.delay(1, 7) == 0.0


def _fit(values: np.ndarray):
    return fit_delay([Extra(i % 4, i // 4, float(v), math.nan) for i, v in enumerate(values)])


def test_the_fitted_family_and_its_numbers():
    rng = np.random.default_rng(7)
    fit = _fit(rng.exponential(0.05, 2000))
    assert fit.family == "exp" and float(fit.spec.split(":")[1]) == pytest.approx(0.05, rel=0.1)
    fit = _fit(0.2 + rng.exponential(0.05, 2000))
    shift, mean = map(float, fit.spec.split(":")[1:])
    assert fit.family == "shiftexp" and shift == pytest.approx(0.2, rel=0.02) and mean == pytest.approx(0.05, rel=0.1)
    fit = _fit(rng.lognormal(math.log(0.05), 1.0, 2000))
    mean, sigma = map(float, fit.spec.split(":")[1:])
    assert fit.family == "lognormal" and sigma == pytest.approx(1.0, rel=0.1)
    assert mean == pytest.approx(0.05 * math.exp(0.5), rel=0.15)
    assert "lognormal" in fit.aic and len(fit.aic) == 2  # and one exponential, shifted here
    assert _fit(np.zeros(100)).spec == "none"
    assert fit_delay([Extra(w, t, 0.4 if w == 1 else 0.0, 0.0) for w in range(3) for t in range(9)],
                     {1: 0.4}).spec == "fixed:1:0.4"  # nothing but a slow worker
    for spec in (fit.spec, "fixed:1:0.4"):
        DelayModel(spec, 4)


def test_a_run_folder_and_a_pgc_sim_out_file_are_measured_alike(tmp_path):
    records = _records(_exp(0.05, seed=8, slow={0: 0.2}), steps=50)
    metrics = MetricsWriter(tmp_path / "run")  # metrics.jsonl and messages.bin, as pgc-train writes them
    for record in records:
        metrics.write(record)
    metrics.close()
    folder = measure(tmp_path / "run")
    memory = summarize(extras(records))
    assert folder.overall.mean == pytest.approx(memory.overall.mean, abs=1e-9)
    assert folder.fit.spec == memory.fit.spec and list(folder.slow) == [0] and folder.first_step == 5
    out = tmp_path / "sim.jsonl"
    with out.open("w") as fh:
        for scheme in ("dgd", "pgc-cr"):
            for r in records:
                fh.write(json.dumps({"scheme": scheme, "seed": 1, **_plain(r)}) + "\n")
            fh.write(json.dumps({"scheme": scheme, "seed": 1, "event": "eval", "step": 49}) + "\n")
    with pytest.raises(ConfigError, match="holds 2 runs"):
        load_steps(out)
    assert measure(out, scheme="dgd").overall.mean == pytest.approx(memory.overall.mean, abs=1e-9)
    with pytest.raises(ConfigError, match="no such run folder"):
        measure(tmp_path / "none")
