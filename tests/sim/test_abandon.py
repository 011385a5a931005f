"""--abandon-late in the simulator: where a worker checks, which schemes abandon, and that a worker
that abandons decided steps changes nothing the master decodes from (pgc_mpi.core.abandon)."""

import numpy as np
import pytest

from pgc_mpi.config import SimConfig
from pgc_mpi.core.abandon import abandon_margin, abandons, check_points, drop_costs_a_gradient, next_check_point
from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.learning.problems import PROBLEMS
from pgc_mpi.sim.simulator import simulate


def test_check_points_after_each_forward_and_between_micro_batches():
    assert check_points(0.0, 0.3, 1) == pytest.approx([0.1])  # one batch: before its backward
    assert check_points(1.0, 1.6, 2) == pytest.approx([1.1, 1.3, 1.4])  # then the last batch's forward
    assert next_check_point(1.0, 1.6, 2, told=1.25) == pytest.approx(1.3)
    assert next_check_point(1.0, 1.6, 2, told=1.45) is None  # past the last: it finishes, late


def test_a_dropped_pipelined_slot_costs_a_gradient_only_past_the_staleness_bound():
    fr = make_scheme("pgc-fr", n=6, s=2)  # c = 3: worker 0's step-t job computes slot t mod 3
    kept_up = [3, 4, 5]  # before its step-6 job: slot k last computed at step 3 + k
    # dropped, slot 0 keeps version 3 until its next turn, step 9: step 8's message sends it 5 steps old
    assert drop_costs_a_gradient(fr, 0, 6, (0,), kept_up, bound=2)
    assert drop_costs_a_gradient(fr, 0, 6, (0,), kept_up, bound=4)
    assert not drop_costs_a_gradient(fr, 0, 6, (0,), kept_up, bound=5)
    assert not drop_costs_a_gradient(fr, 0, 6, (0,), kept_up, bound=None)  # --max-staleness none
    assert not drop_costs_a_gradient(make_scheme("is-sgd", n=6, s=2), 0, 6, (0,), [5], bound=0)


def test_a_worker_drops_a_job_only_with_more_than_a_gradient_of_it_left_where_dropping_costs_one():
    assert abandon_margin(True, 0.05) == 0.05 and abandon_margin(False, 0.05) == 0.0
    assert next_check_point(1.0, 1.6, 2, told=1.25, margin=0.25) == pytest.approx(1.3)  # 0.3 s left
    assert next_check_point(1.0, 1.6, 2, told=1.05, margin=0.45) == pytest.approx(1.1)  # 0.5 s left
    assert next_check_point(1.0, 1.6, 2, told=1.25, margin=0.35) is None  # 0.3 s, then 0.2 s left: it finishes


def test_dgd_and_pbs_never_abandon_the_others_may():
    assert [name for name in ("dgd", "is-sgd", "gc-cr", "is-gc-fr", "pgc-fr", "pgc-cr", "pbs") if abandons(name)] \
        == ["is-sgd", "gc-cr", "is-gc-fr", "pgc-fr", "pgc-cr"]


def _run(scheme: str, abandon: bool, delay: str, steps: int = 30, **kw):
    cfg = SimConfig(scheme=scheme, workers=4, stragglers=1, steps=steps, lr=0.1, delay=delay, seed=3,
                    compute_time=0.1, abandon_late=abandon, **kw)
    return simulate(cfg, PROBLEMS["least-squares"](4, samples=80, dim=5, seed=3))


def test_a_straggler_that_never_counts_abandons_its_steps_and_the_run_is_unchanged():
    """Worker 3 is always 1 s slower, so is-sgd (s = 1) decodes every step from workers 0..2 and
    worker 3's messages are all late. With --abandon-late it stops each decided step at its first
    check point instead (after its first job, which fills nothing and is never abandoned): no
    late message past that one, and the same parameters, steps and times as without."""
    plain, quick = _run("is-sgd", False, "fixed:3:1.0"), _run("is-sgd", True, "fixed:3:1.0")
    assert sum(r["late"] for r in plain.records) >= 2
    assert sum(r["late"] for r in quick.records) == 1  # its first job
    # its jobs after the first begin at 1.1, 1.467, 1.833, 2.2, 2.567 and 2.933 s (each dropped at its
    # first check point, a third of its 1.1 s in): six by the end at 3 s, each abandoned once
    assert sum(r["abandoned"] for r in quick.records) == 6
    assert np.array_equal(plain.params, quick.params)
    assert [r["step_time"] for r in plain.records] == pytest.approx([r["step_time"] for r in quick.records])
    assert all(3 not in r["arrivals"] for r in quick.records)


@pytest.mark.parametrize(("scheme", "max_staleness", "abandoned", "late"), [
    ("pgc-fr", "window", [0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]),
    ("pgc-cr", "window", [0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]),
    ("is-sgd", "window", [0, 1, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0]),
    ("pgc-fr", "none", [0, 1, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0]),
    ("pgc-fr", 2, [0, 1, 0, 1, 1, 1], [0, 1, 0, 1, 0, 0]),
])
def test_a_pipelined_straggler_finishes_a_job_with_one_gradient_or_less_left(scheme, max_staleness, abandoned, late):
    """Worker 3 is always 50 ms slower (jobs of 0.1 s compute in 4 micro-batches, s = 1, c = 2): its
    first job ends late at 0.15 s, so its second runs from 0.15 s to 0.3 s and is decided at 0.2 s,
    when the others' step-1 messages arrive. Its check points from there (0.2, 0.225, 0.2375 s)
    leave 0.1 s or less, one partition gradient. Under the staleness window (1 step) the dropped
    slot would be past it at the next job and refreshed: a pipelined worker finishes the job (its
    message is late, its buffer fresh). is-sgd has no buffers, and under --max-staleness none
    nothing is refreshed: both drop it at 0.2 s. Under a bound of 2 the first drop costs nothing
    (the slot's warm-up buffer is sent once more, 2 steps old, before its turn), but dropping step
    2's job would send its slot 3 steps old: that job is finished."""
    cfg = SimConfig(scheme=scheme, workers=4, stragglers=1, steps=6, lr=0.1, delay="fixed:3:0.05", seed=3,
                    compute_time=0.1, abandon_late=True, accumulate=4, max_staleness=max_staleness)
    records = simulate(cfg, PROBLEMS["least-squares"](4, samples=80, dim=5, seed=3)).records
    assert [r["abandoned"] for r in records] == abandoned
    assert [r["late"] for r in records] == late


@pytest.mark.parametrize("scheme", ["pgc-fr", "gc-cr", "pgc-cr", "is-sgd"])
def test_abandoning_schemes_still_decode_correctly(scheme):
    """With random delays workers abandon some steps and finish others; every message the master
    uses is one the scheme accepts, so the exact schemes (pgc-fr with the paper's estimator: its
    buffers weighed by age, a step is exact only over the rotation) still reach the
    least-squares optimum on full-partition gradients, and the others converge as well as without
    abandoning."""
    plain = _run(scheme, False, "exp:0.1", steps=400, staleness_correction="none")
    quick = _run(scheme, True, "exp:0.1", steps=400, staleness_correction="none")
    assert sum(r["abandoned"] for r in quick.records) > 20
    gap = quick.evals[-1]["gap"]
    assert gap < 1e-8 if scheme in ("pgc-fr", "gc-cr") else gap < 10 * max(plain.evals[-1]["gap"], 1e-6)


@pytest.mark.parametrize("scheme", ["dgd", "pbs"])
def test_dgd_and_pbs_runs_are_the_same_with_the_flag(scheme):
    plain, flagged = _run(scheme, False, "exp:0.1"), _run(scheme, True, "exp:0.1")
    assert np.array_equal(plain.params, flagged.params)
    assert "abandoned" not in flagged.records[-1]
