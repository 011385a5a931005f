"""Straggler models: seeded per (worker, step), independent of call order, clear parse errors."""

from __future__ import annotations

import math

import pytest

from pgc_mpi.errors import ConfigError
from pgc_mpi.stragglers import DelayModel


def test_exp_is_reproducible_and_order_free():
    m = DelayModel("exp:2.0", n=6, seed=3)
    forward = [m.delay(w, t) for t in range(50) for w in range(6)]
    backward = [m.delay(w, t) for t in reversed(range(50)) for w in reversed(range(6))]
    assert forward == list(reversed(backward))
    assert 1.5 < sum(forward) / len(forward) < 2.5
    assert DelayModel("exp:2.0", n=6, seed=4).delay(0, 0) != m.delay(0, 0)


def test_fixed_random_hang_and_sum():
    m = DelayModel("fixed:1,3:0.5+random:2:4+hang:5@7", n=6, seed=0)
    for t in range(20):
        slow = [w for w in range(6) if m.delay(w, t) >= 4]
        assert len(slow) == 2 or (t >= 7 and 5 in slow)
        assert m.delay(1, t) in (0.5, 4.5) and m.delay(0, t) in (0.0, 4.0)
    assert m.delay(5, 6) < math.inf and m.delay(5, 7) == math.inf
    assert m.hangs() == {5: 7}
    assert not DelayModel("none", n=3).active


@pytest.mark.parametrize("spec,msg", [
    ("gauss:1", "not a straggler model"), ("exp:-1", ">= 0"), ("exp:abc", "must be a number"),
    ("fixed:9:1", "outside 0..3"), ("random:5:1", "1..4"), ("hang:1@x", "STEP"), ("exp", "not a"),
])
def test_bad_specs(spec, msg):
    with pytest.raises(ConfigError, match=msg):
        DelayModel(spec, n=4)
