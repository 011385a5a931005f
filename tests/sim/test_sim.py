"""The simulator: convergence, determinism, straggler semantics, deadlines, replay, CLI."""

from __future__ import annotations

import numpy as np
import pytest

from pgc_mpi.config import SimConfig
from pgc_mpi.core.collector import DeadlineMissed
from pgc_mpi.core.message import MessageRecord
from pgc_mpi.core.schemes import SCHEME_NAMES, make_scheme
from pgc_mpi.learning.problems import LeastSquares, Logistic
from pgc_mpi.runs.metrics import MASTER_PARTS
from pgc_mpi.sim.cli import main as sim_main
from pgc_mpi.sim.replaying import replay
from pgc_mpi.sim.simulator import simulate


@pytest.fixture(scope="module")
def lsq12() -> LeastSquares:
    return LeastSquares(12, samples=480, dim=10, seed=3)


@pytest.mark.parametrize("scheme", ["dgd", "gc-fr", "gc-cr", "pgc-fr", "is-gc-fr", "pbs"])
def test_exact_schemes_reach_the_least_squares_optimum(lsq12, scheme):
    """pgc-fr with the paper's estimator; weighed by age (the default) see the next test."""
    cfg = SimConfig(scheme=scheme, workers=12, stragglers=2, steps=400, lr=0.3, delay="exp:1.0", seed=1,
                    staleness_correction="none")
    res = simulate(cfg, lsq12)
    assert res.stalled is None
    assert res.evals[-1]["gap"] < 1e-8


@pytest.mark.parametrize("scheme, correction", [("pgc-cr", "none"), ("pgc-cr", "weights:0.3"),
                                                ("pgc-fr", "weights:0.3"), ("pgc-fr", "weights:0")])
def test_biased_steps_reach_a_small_floor_but_not_zero(lsq12, scheme, correction):
    """pgc-cr's relaxed decode, and a pipeline whose buffers are weighed by age (each step favours
    the partitions it computed fresh; only the rotation weighs them all alike), are biased per step
    at a constant rate: a floor near the optimum, not the optimum."""
    cfg = SimConfig(scheme=scheme, workers=12, stragglers=2, steps=400, lr=0.3, delay="exp:1.0", seed=1,
                    staleness_correction=correction)
    res = simulate(cfg, lsq12)
    gaps = [e["gap"] for e in res.evals]
    assert gaps[-1] < 1e-5 * gaps[0]
    assert min(gaps[-50:]) > 0


def test_same_seed_is_bit_identical_and_other_seed_differs(lsq12):
    cfg = SimConfig(scheme="pgc-cr", workers=12, stragglers=1, steps=60, lr=0.2, delay="exp:0.5", seed=7)
    a, b = simulate(cfg, lsq12, record_params=True), simulate(cfg, lsq12, record_params=True)
    assert all(np.array_equal(x, y) for x, y in zip(a.trajectory, b.trajectory))
    assert [r["wall_time"] for r in a.records] == [r["wall_time"] for r in b.records]
    c = simulate(SimConfig(**{**cfg.__dict__, "seed": 8}), lsq12)
    assert [r["wall_time"] for r in c.records] != [r["wall_time"] for r in a.records]


def test_pipelined_staleness_is_at_most_s_without_stragglers(lsq12):
    res = simulate(SimConfig(scheme="pgc-cr", workers=12, stragglers=3, steps=30, delay="none"), lsq12)
    assert max(r["max_staleness"] for r in res.records) == 3
    assert all(len(r["used"]) == 12 for r in res.records)  # simultaneous arrivals all count


@pytest.mark.parametrize("scheme,per_step", [("dgd", 1.0), ("gc-cr", 3.0), ("gc-fr", 3.0),
                                             ("pgc-cr", 1.0), ("pgc-fr", 1.0), ("is-sgd", 1.0)])
def test_step_time_without_stragglers_is_the_compute_per_step(lsq12, scheme, per_step):
    res = simulate(SimConfig(scheme=scheme, workers=12, stragglers=2, steps=10, delay="none", compute_time=1.0), lsq12)
    assert res.median_step_time() == pytest.approx(per_step)


def test_pipelined_warmup_costs_c_minus_one_gradients(lsq12):
    res = simulate(SimConfig(scheme="pgc-fr", workers=12, stragglers=2, steps=3, delay="none"), lsq12)
    assert [r["wall_time"] for r in res.records] == [3.0, 4.0, 5.0]


def test_a_slow_worker_is_late_and_follows_the_newest_model(lsq12):
    res = simulate(SimConfig(scheme="pgc-cr", workers=12, stragglers=1, steps=40, delay="fixed:4:2.5"), lsq12)
    assert sum(r["late"] for r in res.records) > 0
    assert all(4 not in r["used"] for r in res.records)
    assert res.median_step_time() == pytest.approx(1.0)


def test_staleness_bound_rejects_or_refreshes_old_buffers(lsq12):
    base = dict(scheme="pgc-cr", workers=12, stragglers=1, steps=40, delay="random:1:1.5", max_staleness=1, seed=2)
    rejecting = simulate(SimConfig(**base, on_stale="reject"), lsq12)
    assert all(r["max_staleness"] <= 1 for r in rejecting.records)
    assert sum(r["stale_rejected"] for r in rejecting.records) > 0
    assert sum(r["refreshed"] for r in rejecting.records) == 0
    refreshing = simulate(SimConfig(**base, on_stale="refresh"), lsq12)
    assert all(r["max_staleness"] <= 1 for r in refreshing.records)
    assert sum(r["stale_rejected"] for r in refreshing.records) == 0  # a catch-up message is never over the bound
    refreshed = sum(r["refreshed"] for r in refreshing.records)
    assert refreshed > 0
    # the catch-up gradients are in the messages' gradient counts: one fresh gradient each, plus them
    messages = [MessageRecord._make(m) for r in refreshing.records for m in r["messages"]]
    assert sum(m.gradients for m in messages) == len(messages) + refreshed
    unbounded = simulate(SimConfig(**{**base, "max_staleness": "none"}), lsq12)
    assert max(r["max_staleness"] for r in unbounded.records) > 1


@pytest.mark.parametrize("delay", ["exp:1.0", "bimodal:0.3:0.1:4:8", "hang:3@5+exp:0.5"])
@pytest.mark.parametrize("scheme", SCHEME_NAMES)
@pytest.mark.parametrize("on_stale", ["refresh", "reject"])
def test_default_staleness_stays_within_the_scheme_s_window(lsq12, scheme, delay, on_stale):
    cfg = SimConfig(scheme=scheme, workers=12, stragglers=2, steps=120, delay=delay, seed=7, on_stale=on_stale)
    res = simulate(cfg, lsq12)
    window = cfg.make_scheme(12).staleness_window()
    assert window == {"pgc-fr": 2, "pgc-cr": 2, "pbs": 1}.get(scheme, 0)
    if scheme == "dgd" and "hang" in delay:  # dgd waits for every worker: a hang stops it
        assert res.stalled is not None and len(res.records) == 5
    else:
        assert res.stalled is None and len(res.records) == 120
    assert max(r["max_staleness"] for r in res.records) <= window
    # warm-up buffers count as computed at the initial model: step 0 uses nothing older than it
    assert res.records[0]["max_staleness"] == 0


def test_hung_worker_coded_scheme_finishes_dgd_stalls(lsq12):
    ok = simulate(SimConfig(scheme="pgc-cr", workers=12, stragglers=1, steps=30, delay="hang:3@5"), lsq12)
    assert ok.stalled is None and len(ok.records) == 30
    stuck = simulate(SimConfig(scheme="dgd", workers=12, stragglers=1, steps=30, delay="hang:3@5"), lsq12)
    assert stuck.stalled is not None and len(stuck.records) == 5


def test_deadline_policies(lsq12):
    base = dict(scheme="dgd", workers=12, stragglers=1, steps=20, delay="hang:3@5", deadline=2.0)
    with pytest.raises(DeadlineMissed, match="missing workers \\[3\\]"):
        simulate(SimConfig(**base, on_deadline="fail"), lsq12)
    res = simulate(SimConfig(**base, on_deadline="partial"), lsq12)
    assert len(res.records) == 20
    missed = [r for r in res.records if r["deadline_missed"]]
    assert len(missed) == 15 and all(r["residual"] > 0 and 3 not in r["used"] for r in missed)
    assert all(r["step_time"] == pytest.approx(2.0) for r in missed)


def test_replay_reproduces_the_simulated_trajectory(lsq12):
    cfg = SimConfig(scheme="pgc-cr", workers=12, stragglers=2, steps=25, lr=0.2, delay="exp:1.0", seed=4)
    res = simulate(cfg, lsq12, record_params=True)
    scheme = make_scheme("pgc-cr", 12, 2, seed=4)
    again = replay(scheme, lsq12, res.records, lr=0.2)
    assert all(np.array_equal(x, y) for x, y in zip(again, res.trajectory))


def test_a_pbs_replay_of_the_messages_in_their_order_reproduces_the_simulated_trajectory():
    """pbs's replay: each step's messages enter the table in the order the master took them in, the
    step decodes after the last (the MPI tests replay --servers K runs this way)."""
    problem = LeastSquares(6, samples=240, dim=10, batch_size=8, seed=3)
    cfg = SimConfig(scheme="pbs", workers=6, replication=2, c=3, steps=30, lr=0.1, delay="exp:1.0", seed=5)
    res = simulate(cfg, problem, record_params=True)
    assert any(m[5] == "stale" for r in res.records for m in r["messages"])  # the order mattered
    again = replay(make_scheme("pbs", 6, 0, c=3, replication=2), problem, res.records, lr=0.1)
    assert max(np.abs(x - y).max() for x, y in zip(again, res.trajectory, strict=True)) < 1e-12


def test_minibatches_and_logistic_converge():
    prob = Logistic(8, samples=800, dim=5, batch_size=20, seed=1)
    res = simulate(SimConfig(scheme="pgc-fr", workers=8, stragglers=1, steps=300, lr=0.5, delay="exp:0.5"), prob)
    assert res.evals[-1]["gap"] < 0.05 * res.evals[0]["gap"]


def test_thousand_workers_run(lsq12):
    prob = LeastSquares(1000, samples=2000, dim=5)
    res = simulate(SimConfig(scheme="pgc-cr", workers=1000, stragglers=3, steps=3, delay="exp:1.0"), prob)
    assert len(res.records) == 3 and all(len(r["arrivals"]) >= 997 for r in res.records)


def test_cli_prints_the_comparison(capsys):
    assert sim_main(["--schemes", "dgd,pgc-cr", "--steps", "30", "--samples", "240"]) == 0
    out = capsys.readouterr().out
    assert "pgc-cr" in out and "vs dgd" in out


def test_cli_rejects_unknown_scheme(capsys):
    assert sim_main(["--schemes", "dgd,nope"]) == 2
    assert "unknown scheme" in capsys.readouterr().err


@pytest.mark.parametrize(("deadline", "policy", "message"), [
    (0.0, "wait", "--deadline must be a number > 0"),
    (float("nan"), "wait", "--deadline must be a number > 0"),
    (1.0, "panic", "--on-deadline 'panic' is not one of: wait, partial, fail"),
])
def test_simulator_refuses_a_bad_deadline_like_pgc_train(deadline, policy, message):
    from pgc_mpi.config import TrainConfig
    from pgc_mpi.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        SimConfig(scheme="dgd", workers=4, stragglers=0, steps=3, deadline=deadline, on_deadline=policy)
    with pytest.raises(ConfigError, match=message):
        TrainConfig(deadline=deadline, on_deadline=policy).validate(workers=4)


def test_pbs_obeys_the_deadline_policies_like_the_master(lsq12):
    # workers 3 and 4 both hold partition 4 (cyclic, c = 2): once they hang, the table goes stale
    base = dict(scheme="pbs", workers=12, stragglers=1, steps=20, delay="hang:3@4+hang:4@4", deadline=3.0)
    with pytest.raises(DeadlineMissed, match="partitions \\[4\\]"):
        simulate(SimConfig(**base, on_deadline="fail"), lsq12)
    res = simulate(SimConfig(**base, on_deadline="partial"), lsq12)
    assert len(res.records) == 20 and res.stalled is None
    missed = [r for r in res.records if r["deadline_missed"]]
    assert missed and all(r["partial"] and r["step_time"] == pytest.approx(3.0) for r in missed)
    assert all(r["ages"][4] >= 2 for r in missed)  # the lost partition's entry only ages
    waited = simulate(SimConfig(**base, on_deadline="wait"), lsq12)
    assert waited.stalled is not None and "partitions [4]" in waited.stalled


def test_pbs_rejects_messages_over_max_staleness(lsq12):
    cfg = SimConfig(scheme="pbs", workers=12, stragglers=1, steps=40, delay="random:2:2.5", max_staleness=1, seed=3)
    res = simulate(cfg, lsq12)
    rejected = [r for r in res.records if r["rejected"]]
    assert rejected
    for r in res.records:
        for m in map(MessageRecord._make, r["messages"]):
            assert m.verdict == "stale" or r["step"] - m.step <= 1
    unbounded = simulate(SimConfig(**{**cfg.__dict__, "max_staleness": "none"}), lsq12)
    assert not any(r["rejected"] for r in unbounded.records)


def test_simulator_and_master_share_the_step_record_layout(lsq12):
    coded = simulate(SimConfig(scheme="pgc-cr", workers=12, stragglers=1, steps=3, delay="exp:1.0"), lsq12)
    table = simulate(SimConfig(scheme="pbs", workers=12, stragglers=1, steps=3, delay="exp:1.0"), lsq12)
    shared = {"step", "wall_time", "step_time", *(f"{part}_time" for part in MASTER_PARTS), "bytes_received",
              "arrivals", "used", "late",
              "rejected", "deadline_missed", "partial", "residual", "max_staleness", "messages", "train_loss",
              "wire_error"}
    assert shared <= set(coded.records[0]) and shared <= set(table.records[0])
    assert "versions" in coded.records[0] and "ages" in table.records[0]
    assert {"stale_rejected"} <= set(coded.records[0]) & set(table.records[0])
    assert "refreshed" in coded.records[0]
    assert {"new_gradients", "grad_norm_sq", "displacement", "displaced_entries"} <= set(table.records[0])
    m = MessageRecord._make(coded.records[0]["messages"][0])
    assert m.verdict in ("used", "accepted") and m.compute_time == 1.0


@pytest.mark.parametrize("scheme", ["gc-fr", "pgc-fr", "is-gc-fr"])
def test_the_paper_s_fr_rule_waits_for_n_minus_s_arrivals_and_decodes_the_same(lsq12, scheme):
    base = dict(scheme=scheme, workers=12, stragglers=2, steps=30, lr=0.1, delay="exp:1.0", seed=5)
    covered = simulate(SimConfig(**base), lsq12)
    paper = simulate(SimConfig(**base, fr_decode="n-s"), lsq12)
    assert all(len(r["arrivals"]) >= 10 for r in paper.records)
    assert any(len(r["arrivals"]) < 10 for r in covered.records)  # covered decodes earlier
    assert paper.median_step_time() > covered.median_step_time()
    assert all(r["residual"] < 1e-12 for r in paper.records + covered.records)  # exact either way


def test_pbs_never_steps_without_a_new_gradient(lsq12):
    for delay in ("none", "exp:1.0"):
        res = simulate(SimConfig(scheme="pbs", workers=12, stragglers=1, steps=100, lr=0.1, delay=delay), lsq12)
        assert all(r["new_gradients"] >= 1 for r in res.records)
        for r in res.records:
            assert r["new_gradients"] <= sum(MessageRecord._make(m).verdict == "used" for m in r["messages"])


def test_pbs_without_delays_computes_every_gradient_at_the_current_model(lsq12):
    """The worker whose message completes step t restarts from w_{t+1}: with no delays every
    message is computed at the model of the step it arrives in (before, step 1 repeated step 0's
    model), and every step has a new gradient."""
    res = simulate(SimConfig(scheme="pbs", workers=12, steps=20, delay="none"), lsq12)
    for r in res.records:
        assert r["new_gradients"] >= 1
        assert all(m.step == r["step"] for m in map(MessageRecord._make, r["messages"]))


def test_pbs_replication_and_window_are_separate(lsq12):
    cfg = SimConfig(scheme="pbs", workers=12, replication=2, c=4, steps=80, delay="exp:1.0", seed=2)
    scheme = cfg.make_scheme(12)
    assert (scheme.c, scheme.table_window, cfg.staleness_bound(scheme)) == (2, 4, 3)
    res = simulate(cfg, lsq12)
    assert max(r["max_staleness"] for r in res.records) == 3  # the wider window is used, never exceeded
    assert all(r["new_gradients"] >= 1 for r in res.records)
    # the diagnostics: cheap ones every step, probes every --probe-every (20) steps
    assert all({"grad_norm_sq", "displacement"} <= set(r) for r in res.records)
    probes = [r for r in res.records if "error_bound" in r]
    assert [r["step"] for r in probes] == [19, 39, 59, 79]
    assert all({"smoothness", "stale_cosine"} <= set(r) for r in probes)


def test_pgc_sim_reports_mean_and_spread_over_seeds(capsys):
    assert sim_main(["--schemes", "dgd,pgc-cr,pbs", "--steps", "20", "--samples", "240", "--seeds", "3",
                     "--replication", "2", "--c", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 seed(s): mean±sd" in out and "--max-staleness window, --on-stale refresh" in out
    row = next(line for line in out.splitlines() if line.startswith("pgc-cr"))
    assert "3/3" in row and "±" in row
    assert sim_main(["--seeds", "0"]) == 2


def test_fixed_minibatch_uses_each_partition_s_first_minibatch(lsq12):
    from pgc_mpi.learning.problems import FirstMinibatch, LeastSquares

    problem = LeastSquares(12, samples=1200, batch_size=10)
    fixed = FirstMinibatch(problem)
    w = np.ones(problem.dim)
    np.testing.assert_array_equal(fixed.grad(w, 3, 7), problem.grad(w, 3, 0))
    assert not np.array_equal(problem.grad(w, 3, 7), problem.grad(w, 3, 0))
    assert fixed.dim == problem.dim and fixed.optimum == problem.optimum
    base = dict(scheme="pgc-cr", workers=12, steps=15, delay="exp:1.0", seed=1)
    a = simulate(SimConfig(**base, fixed_minibatch=True), problem, record_params=True)
    b = simulate(SimConfig(**base), fixed, record_params=True)  # the same as wrapping it yourself
    c = simulate(SimConfig(**base), problem, record_params=True)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)


def test_the_sim_package_gives_the_functions_its_docstring_names():
    """`from pgc_mpi.sim import replay` is the function, not the module that holds it."""
    import pgc_mpi
    import pgc_mpi.sim as sim

    assert sim.replay is replay and sim.simulate is simulate and pgc_mpi.replay is replay
    assert callable(sim.SimResult)
