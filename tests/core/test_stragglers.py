"""Straggler models: seeded per (worker, step), independent of call order, clear parse errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pgc_mpi.core.stragglers import DelayModel
from pgc_mpi.errors import ConfigError


def test_exp_is_reproducible_and_order_free():
    m = DelayModel("exp:2.0", n=6, seed=3)
    forward = [m.delay(w, t) for t in range(50) for w in range(6)]
    backward = [m.delay(w, t) for t in reversed(range(50)) for w in reversed(range(6))]
    assert forward == list(reversed(backward))
    assert 1.5 < sum(forward) / len(forward) < 2.5
    assert DelayModel("exp:2.0", n=6, seed=4).delay(0, 0) != m.delay(0, 0)


def test_fixed_random_hang_and_sum():
    m = DelayModel("fixed:1,3:0.5+random:2:4+hang:5@7", n=6, seed=0)
    # From step 7 on worker 5's hang hides whether random:2 picked it, so the count is checked on the same
    # terms without the hang (same term positions, same draws) and m must equal that model except for the hang.
    no_hang = DelayModel("fixed:1,3:0.5+random:2:4", n=6, seed=0)
    picked = []
    for t in range(20):
        slow = [w for w in range(6) if no_hang.delay(w, t) >= 4]
        assert len(slow) == 2, (t, slow)
        picked.append(tuple(slow))
        assert [m.delay(w, t) for w in range(6)] == [
            math.inf if w == 5 and t >= 7 else no_hang.delay(w, t) for w in range(6)], t
        assert m.delay(1, t) in (0.5, 4.5) and m.delay(0, t) in (0.0, 4.0)
    assert len(set(picked)) > 1  # drawn afresh every step
    assert m.delay(5, 6) < math.inf and m.delay(5, 7) == math.inf
    assert m.hangs() == {5: 7}
    assert not DelayModel("none", n=3).active


@pytest.mark.parametrize("spec,msg", [
    ("gauss:1", "not a straggler model"), ("exp:-1", "in \\[0, inf\\]"), ("exp:abc", "must be a number"),
    ("fixed:9:1", "outside 0..3"), ("random:5:1", "1..4"), ("hang:1@x", "STEP"), ("exp", "not a"),
])
def test_bad_specs(spec, msg):
    with pytest.raises(ConfigError, match=msg):
        DelayModel(spec, n=4)


def _draws(spec: str, n: int = 4, steps: int = 400, seed: int = 1) -> np.ndarray:
    m = DelayModel(spec, n=n, seed=seed)
    return np.array([[m.delay(w, t) for t in range(steps)] for w in range(n)])


def test_distribution_families_have_their_shape():
    shifted = _draws("shiftexp:0.5:1.0")
    assert shifted.min() >= 0.5 and 1.3 < shifted.mean() < 1.7
    logn = _draws("lognormal:2.0:0.8")
    assert logn.min() > 0 and 1.7 < logn.mean() < 2.3
    heavy = _draws("pareto:1.0:1.5")
    assert heavy.min() >= 0 and heavy.max() > 10 * np.median(heavy)  # a heavy tail
    bimodal = _draws("bimodal:0.1:0.05:10:30")
    stalls = bimodal > 5
    assert 0.03 < stalls.mean() < 0.07 and bimodal[stalls].min() >= 10 and bimodal[~stalls].max() < 5


def test_markov_bursts_and_order_independence():
    m = DelayModel("markov:0.1:0.25:2.0", n=3, seed=2)
    backward = [m.delay(w, t) for t in reversed(range(300)) for w in range(3)]
    fresh = DelayModel("markov:0.1:0.25:2.0", n=3, seed=2)
    forward = [fresh.delay(w, t) for t in range(300) for w in range(3)]
    assert backward == [fresh.delay(w, t) for t in reversed(range(300)) for w in range(3)]
    slow = np.array(forward).reshape(300, 3).T > 0
    runs = [len(r) for row in slow for r in "".join("1" if v else "0" for v in row).split("0") if r]
    assert 2.5 < np.mean(runs) < 6  # mean burst length 1/PF = 4 steps
    assert 0.15 < slow.mean() < 0.45  # stationary share PS/(PS+PF) ~ 0.29
    assert sorted(backward) == sorted(forward)


def test_persistent_slow_workers_are_fixed_for_the_run():
    d = _draws("persistent:2:1.5", n=6)
    slow_rows = [w for w in range(6) if (d[w] == 1.5).all()]
    assert len(slow_rows) == 2 and all((d[w] == 0).all() for w in range(6) if w not in slow_rows)


def test_trace_replays_a_run_exactly(tmp_path):
    from pgc_mpi.core.stragglers import write_trace

    m = DelayModel("exp:0.3+random:1:2", n=5, seed=4)
    rows = [(w, t, m.delay(w, t)) for w in range(5) for t in range(30)]
    path = tmp_path / "trace.csv"
    write_trace(path, rows)
    replayed = DelayModel(f"trace:{path}", n=5)
    assert all(replayed.delay(w, t) == pytest.approx(d, rel=1e-15) for w, t, d in rows)
    assert replayed.delay(0, 99) == 0.0


@pytest.mark.parametrize("content,msg", [("a,b\n1,2\n", "header must name"), ("worker,step,delay\n1,x,2\n", "line 2"),
                                         ("worker,step,delay\n9,1,2\n", "worker must be in 0..4")])
def test_bad_traces(tmp_path, content, msg):
    path = tmp_path / "t.csv"
    path.write_text(content)
    with pytest.raises(ConfigError, match=msg):
        DelayModel(f"trace:{path}", n=5)
    with pytest.raises(ConfigError, match="no such file"):
        DelayModel(f"trace:{tmp_path}/none.csv", n=5)
