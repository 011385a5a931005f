"""--staleness-correction weights:R (pgc_mpi.core.age_weights): the weights a pgc-* worker gives its
buffers by age. What must hold: every message's weights sum to c; every computed gradient gets the
same total weight over its uses as under the paper's estimator (nothing inflated or lost, only its
effective delay shrinks); each decoded step is a convex combination of gradients; the holders of a
partition weigh it alike (pgc-fr's group members send equal messages); weights:1 is the paper's
estimator; the other schemes ignore it; and the simulator and its replay apply it alike."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from pgc_mpi.config import SimConfig
from pgc_mpi.core.age_weights import age_weights, applied_correction, parse_correction
from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.errors import ConfigError, SchemeError
from pgc_mpi.learning.problems import LeastSquares
from pgc_mpi.sim.replaying import replay
from pgc_mpi.sim.simulator import simulate

RATIOS = ("none", "weights:1", "weights:0.5", "weights:0.3", "weights:0")


def test_the_option_is_none_or_a_ratio_between_0_and_1():
    assert parse_correction("none") is None
    assert parse_correction(" Weights:0.3 ") == 0.3
    assert parse_correction("weights:0") == 0.0 and parse_correction("weights:1") == 1.0
    for bad in ("weights:1.5", "weights:-0.1", "weights:x", "weights:nan", "fresh", "", 0.3, None):
        with pytest.raises(ConfigError, match=r"^--staleness-correction must be none .* or weights:R") as exc:
            parse_correction(bad)
        assert "\n" not in str(exc.value)
    with pytest.raises(SchemeError, match="staleness-correction"):
        make_scheme("pgc-cr", 6, 1, staleness_correction="weights:2")


@pytest.mark.parametrize("c", [1, 2, 3, 5])
def test_the_weights_of_a_message_sum_to_c_and_fall_with_age(c):
    for ratio in (0.0, 0.3, 0.5, 1.0):
        e = age_weights(c, ratio)
        assert e.sum() == pytest.approx(c) and np.all(np.diff(e) <= 0)
    np.testing.assert_array_equal(age_weights(c, None), np.ones(c))
    np.testing.assert_allclose(age_weights(c, 1.0), np.ones(c))
    np.testing.assert_allclose(age_weights(c, 0.0), [c] + [0] * (c - 1))
    np.testing.assert_allclose(age_weights(2, 0.5), [4 / 3, 2 / 3])  # the stability model's c = 2 weights


def decoded_weights(sch, steps: int, arrived=None) -> list[dict[tuple[int, int], float]]:
    """Per step: the weight of each gradient (partition, version) in the decoded gradient, the
    buffers' versions following the rotation (every worker answers every step)."""
    n, c = sch.n, sch.c
    versions = [list(sch.initial_versions()) for _ in range(n)]
    out = []
    for t in range(steps):
        for w in range(n):
            for k in sch.fresh_slots(t, w):
                versions[w][k] = t
        a = sch.decode_weights(range(n) if arrived is None else arrived)
        g: dict[tuple[int, int], float] = defaultdict(float)
        for w in range(n):
            coef = sch.message_coefficients(w, t)
            assert coef.sum() == pytest.approx(c * sch.coefficients(w).mean())  # a message's weights sum to c
            for k in range(c):
                g[(sch.placement[w][k], versions[w][k])] += a[w] * coef[k]
        out.append(dict(g))
    return out


@pytest.mark.parametrize("name, n, s", [("pgc-fr", 6, 1), ("pgc-fr", 12, 2), ("pgc-cr", 4, 1), ("pgc-cr", 12, 2),
                                        ("pgc-cr", 7, 3)])
def test_every_gradient_keeps_its_total_weight_and_each_step_is_a_convex_combination(name, n, s):
    steps = 6 * (s + 1)
    paper = decoded_weights(make_scheme(name, n, s, staleness_correction="none"), steps)
    for spec in RATIOS:
        sch = make_scheme(name, n, s, staleness_correction=spec)
        per_step = decoded_weights(sch, steps)
        totals: dict[tuple[int, int], float] = defaultdict(float)
        expected: dict[tuple[int, int], float] = defaultdict(float)
        for mine, theirs in zip(per_step, paper):
            assert sum(mine.values()) == pytest.approx(1.0) and min(mine.values()) >= -1e-15
            for key, value in mine.items():
                totals[key] += value
            for key, value in theirs.items():
                expected[key] += value
        # gradients computed at steps 0..steps-c have been through every age of the rotation
        whole = [key for key in expected if 0 <= key[1] <= steps - sch.c]
        assert whole and all(totals[key] == pytest.approx(expected[key]) for key in whole), spec
        if spec in ("none", "weights:1"):
            assert all(mine == pytest.approx(theirs) for mine, theirs in zip(per_step, paper))


def test_weights_0_decode_the_fresh_gradients_alone():
    """pgc-fr with weights:0 is dgd on the n/c partitions each step computes fresh; pgc-cr is is-sgd
    with a rotating assignment (every partition once per step)."""
    for name, fresh_count in (("pgc-fr", 4), ("pgc-cr", 12)):
        sch = make_scheme(name, 12, 2, staleness_correction="weights:0")
        for t, g in enumerate(decoded_weights(sch, 9)):
            used = {key: value for key, value in g.items() if value}
            assert all(version == t for _, version in used) and len(used) == fresh_count
            assert all(value == pytest.approx(1 / fresh_count) for value in used.values())


def test_the_holders_of_a_partition_weigh_it_alike():
    sch = make_scheme("pgc-fr", 12, 2, staleness_correction="weights:0.3")
    for t in range(7):
        for g in range(4):
            assert len({tuple(sch.message_coefficients(w, t)) for w in range(3 * g, 3 * g + 3)}) == 1
    cr = make_scheme("pgc-cr", 12, 2, staleness_correction="weights:0.3")
    for t in range(7):  # the one fresh holder of a partition gives it the weight of age 0
        for w in range(12):
            ages = [(t - k) % 3 for k in range(3)]
            np.testing.assert_allclose(cr.message_coefficients(w, t), age_weights(3, 0.3)[ages])


@pytest.mark.parametrize("name", ["dgd", "is-sgd", "gc-fr", "gc-cr", "is-gc-fr", "is-gc-cr"])
def test_schemes_without_stale_buffers_ignore_it(name):
    sch = make_scheme(name, 6, 1, staleness_correction="weights:0")
    for t in range(4):
        for w in range(6):
            np.testing.assert_array_equal(sch.message_coefficients(w, t), sch.coefficients(w))
    assert applied_correction(name, "weights:0") == "none"
    assert applied_correction("pgc-cr", "weights:0.3") == "weights:0.3"
    assert applied_correction("pgc-cr", " Weights:0.30") == "weights:0.3"  # one spelling per rule
    assert applied_correction("pgc-cr", None) == "none"  # a record from before the option
    assert applied_correction("no-such-scheme", "weights:0.3") == "none"


@pytest.fixture(scope="module")
def lsq12() -> LeastSquares:
    return LeastSquares(12, samples=480, dim=10, seed=3)


@pytest.mark.parametrize("name", ["pgc-fr", "pgc-cr"])
def test_the_simulator_and_its_replay_apply_the_correction_alike(lsq12, name):
    base = dict(scheme=name, workers=12, stragglers=2, steps=25, lr=0.2, momentum=0.9, optimizer="nesterov",
                delay="exp:1.0", seed=4)
    paper = simulate(SimConfig(**base, staleness_correction="none"), lsq12, record_params=True)
    one = simulate(SimConfig(**base, staleness_correction="weights:1"), lsq12, record_params=True)
    assert all(np.allclose(x, y, rtol=0, atol=1e-12) for x, y in zip(one.trajectory, paper.trajectory))
    cfg = SimConfig(**base, staleness_correction="weights:0.3")
    res = simulate(cfg, lsq12, record_params=True)
    assert np.abs(res.trajectory[-1] - paper.trajectory[-1]).max() > 1e-6  # it changes the trajectory
    scheme = make_scheme(name, 12, 2, seed=4, staleness_correction="weights:0.3")
    again = replay(scheme, lsq12, res.records, optimizer="nesterov", lr=0.2)
    assert all(np.array_equal(x, y) for x, y in zip(again, res.trajectory))
