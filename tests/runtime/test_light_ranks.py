"""Light ranks: the matrix-free synthetic problem `quadratic`, and pgc-train's synthetic problems
(--problem, --dim, --samples), whose worker ranks never import torch.

In-process: the problem's gradients, determinism, noise and decoding, the configuration and the
run's identity. Under mpiexec (bounded by the helpers): a float64 dgd run that follows the
closed-form trajectory, a noisy pgc-cr run that the simulator replays exactly, the workers'
own record that torch was never loaded, and the one-line error for --problem with --model.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pgc_mpi.config import TrainConfig, config_from_args
from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.problems import PROBLEMS, Quadratic, with_sampling

from helpers import events_of, run_train, steps_of


def _pattern(q: Quadratic) -> tuple[np.ndarray, np.ndarray]:
    """h and t over all of q's coordinates (the stored period, repeated)."""
    reps = -(-q.dim // len(q._h))
    return np.tile(q._h, reps)[:q.dim], np.tile(q._t, reps)[:q.dim]


@pytest.fixture
def short_period(monkeypatch):
    """A period of 7 coordinates, so that small problems exercise the chunks and the repetition."""
    monkeypatch.setattr(Quadratic, "PERIOD", 7)


# --- the problem -------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [None, 5])
def test_the_gradient_is_the_gradient_of_the_loss(short_period, batch_size):
    q = Quadratic(3, samples=60, dim=20, batch_size=batch_size, seed=4)
    w = np.random.default_rng(1).standard_normal(q.dim)
    loss, grad = q.loss_and_grad(w, 1, 6)
    eps = 1e-6
    numeric = [(q.loss_and_grad(w + eps * e, 1, 6)[0] - q.loss_and_grad(w - eps * e, 1, 6)[0]) / (2 * eps)
               for e in np.eye(q.dim)]
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(q.grad(w, 1, 6), grad)
    h, t = _pattern(q)
    assert q.loss(w) == pytest.approx(0.5 * np.sum(h * (w - t) ** 2), rel=1e-12)
    assert (batch_size is None) == np.allclose(grad, h * (w - t))  # noise only with minibatches


def test_curvatures_targets_optimum_and_evaluation(short_period):
    q = Quadratic(4, samples=400, dim=30, batch_size=8, seed=2)
    h, t = _pattern(q)
    assert np.all((h >= 0.1) & (h <= 1.0)) and np.array_equal(h[:7], h[7:14])  # repeats with the period
    assert q.optimum == 0.0 and q.loss(t) == 0.0
    w = q.initial_params()
    assert w.shape == (30,) and not w.any()
    metrics = q.evaluate(w)
    assert set(metrics) == {"train_loss", "gap", "val_loss"}
    assert metrics["gap"] == metrics["train_loss"] == q.loss(w) > 0
    assert metrics["val_loss"] != metrics["train_loss"] and q.evaluate(t)["val_loss"] == 0.0
    assert q.evaluate(w) == metrics  # its held-out samples are fixed
    np.testing.assert_array_equal(q.probe_grad(w), q.probe_grad(w))
    np.testing.assert_allclose(q.probe_grad(t + 1.0) - q.probe_grad(t), h)  # a fixed minibatch: only H moves it


def test_the_noise_is_a_minibatch_mean():
    """Mean zero, and the variance of a mean of b of the partition's m samples: (m - b) / (b (m - 1))."""
    q = Quadratic(2, samples=200, dim=40_000, batch_size=10, seed=0)  # partitions of m = 100
    w = np.zeros(q.dim)
    h, t = _pattern(q)
    z = q.grad(w, 0, 3) - h * (w - t)
    assert abs(z.mean()) < 0.01
    assert z.std() == pytest.approx(np.sqrt(90 / (10 * 99)), rel=0.02)
    whole = Quadratic(2, samples=200, dim=100, batch_size=100, seed=0)  # a whole partition: exact
    np.testing.assert_array_equal(whole.grad(np.ones(100), 1, 0), whole.grad(np.ones(100), 1, 9))


def test_the_same_minibatch_gives_the_same_gradient_on_every_rank():
    ranks = [Quadratic(5, samples=100, dim=200, batch_size=4, seed=9) for _ in range(2)]  # one per "rank"
    w = np.random.default_rng(3).standard_normal(200)
    for partition, draw in [(0, 0), (4, 17), (2, 3)]:
        a, b = (r.loss_and_grad(w, partition, draw) for r in ranks)
        assert a[0] == b[0] and np.array_equal(a[1], b[1])
    q = ranks[0]
    assert not np.array_equal(q.grad(w, 0, 0), q.grad(w, 0, 1))  # another draw
    assert not np.array_equal(q.grad(w, 0, 0), q.grad(w, 1, 0))  # another partition
    assert not np.array_equal(q.grad(w, 0, 0), Quadratic(5, samples=100, dim=200, batch_size=4, seed=8).grad(w, 0, 0))
    g32 = q.grad(w.astype(np.float32), 2, 3)  # a float32 run: the same gradient, rounded
    assert g32.dtype == np.float32 and np.allclose(g32, q.grad(w, 2, 3), rtol=1e-5, atol=1e-5)
    fixed = with_sampling(q, fixed_minibatch=True)  # --fixed-minibatch: always draw 0
    np.testing.assert_array_equal(fixed.grad(w, 3, 12), q.grad(w, 3, 0))


def test_too_few_samples_for_the_partitions():
    with pytest.raises(ConfigError, match="3 training samples, fewer than the 4 partitions"):
        Quadratic(4, samples=3, dim=10)


def test_the_existing_problems_are_unchanged():
    """The registry gained quadratic; least-squares' data and optimum are the same as before."""
    assert set(PROBLEMS) == {"least-squares", "logistic", "quadratic"}
    lsq = PROBLEMS["least-squares"](4, samples=40, dim=3, seed=0)
    assert lsq.X[0, 0] == np.random.default_rng([0, 0x15]).standard_normal((40, 3))[0, 0]


# --- decoding ----------------------------------------------------------------------------------

def test_gc_cr_decodes_the_mean_of_the_partitions_minibatch_gradients():
    """Each worker (its own Quadratic, as on its own rank) codes its partitions' gradients of the
    step's draw; the exact decode of any n - s arrivals is their mean over all partitions."""
    n, s, step = 7, 2, 5
    scheme = make_scheme("gc-cr", n, s, seed=1)
    w = np.random.default_rng(2).standard_normal(50)

    def rank() -> Quadratic:
        return Quadratic(n, samples=140, dim=50, batch_size=4, seed=6)

    messages = []
    for i in range(n):
        q = rank()
        grads = [q.grad(w, p, scheme.draw_index(step, k)) for k, p in enumerate(scheme.placement[i])]
        messages.append(scheme.coefficients(i) @ np.stack(grads))
    q = rank()
    full = np.mean([q.grad(w, p, step) for p in range(n)], axis=0)
    for arrived in ([0, 1, 2, 3, 4], [6, 4, 2, 1, 0], [1, 2, 3, 5, 6]):
        a = scheme.decode_weights(arrived)
        np.testing.assert_allclose(a @ np.stack(messages), full, rtol=1e-9, atol=1e-9)
    assert not np.allclose(full, messages[0])  # the minibatches differ: the decode does combine them


def test_pgc_cr_decodes_the_full_gradient_at_one_model():
    """pgc-cr's buffers hold different draws, so with whole partitions (no noise) its exact
    decode at one model is the full gradient h * (w - t)."""
    n, s = 6, 2
    scheme = make_scheme("pgc-cr", n, s, seed=3)
    q = Quadratic(n, samples=60, dim=40, seed=5)
    w = np.random.default_rng(4).standard_normal(40)
    versions = scheme.warmup_versions(0)
    messages = [scheme.coefficients(i) @ np.stack([q.grad(w, p, scheme.draw_index(versions[k], k))
                                                   for k, p in enumerate(scheme.placement[i])]) for i in range(n)]
    a = scheme.decode_weights([5, 3, 2, 0])
    h, t = _pattern(q)
    np.testing.assert_allclose(a @ np.stack(messages), h * (w - t), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("scheme", ["dgd", "gc-cr", "pgc-cr"])
def test_simulated_schemes_reach_the_optimum_with_whole_partitions(scheme):
    """Every partition has the same minimizer, so even pgc-cr's mix of stale buffers converges to it."""
    from pgc_mpi.config import SimConfig
    from pgc_mpi.sim.simulator import simulate

    q = Quadratic(6, samples=120, dim=300, seed=1)
    res = simulate(SimConfig(scheme=scheme, workers=6, stragglers=2, steps=200, lr=0.5, delay="exp:1.0", seed=1), q)
    assert res.stalled is None and res.evals[-1]["gap"] < 1e-8 * res.evals[0]["gap"]


def test_pgc_sim_runs_the_quadratic_problem(capsys):
    from pgc_mpi.sim.cli import main as sim_main

    assert sim_main(["--problem", "quadratic", "--dim", "1000", "--schemes", "dgd,pgc-cr", "-n", "4",
                     "--steps", "30", "--batch-size", "8"]) == 0
    assert "pgc-cr" in capsys.readouterr().out


# --- configuration and the run's identity ------------------------------------------------------

def test_a_synthetic_problem_s_configuration():
    cfg = config_from_args(["--problem", "quadratic", "--dim", "1000000"])
    cfg.validate(4)
    assert (cfg.problem, cfg.dim, cfg.samples, cfg.batch_size, cfg.model, cfg.dataset) == \
        ("quadratic", 1_000_000, 1200, None, None, None)  # whole partitions; no torch model, no data set
    assert cfg.synthetic and cfg.describe_problem() == "quadratic (dim 1000000, 1200 samples)"
    assert TrainConfig(**cfg.to_dict()) == cfg  # as the workers rebuild it
    torch = TrainConfig()
    assert (torch.model, torch.dataset, torch.batch_size, torch.problem, torch.dim) == \
        ("logreg", "digits", 32, None, None)
    assert not torch.synthetic and config_from_args([]) == torch


def test_a_synthetic_problem_from_a_toml_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('problem = "quadratic"\ndim = 5000\nbatch-size = 16\n')
    cfg = config_from_args(["--config", str(path), "--samples", "640"])
    cfg.validate(4)
    assert (cfg.problem, cfg.dim, cfg.samples, cfg.batch_size) == ("quadratic", 5000, 640, 16)
    with pytest.raises(ConfigError, match="--problem quadratic .* and --dataset other.h5 .* exclude each other"):
        config_from_args(["--config", str(path), "--dataset", "other.h5"]).validate(4)


def test_resume_compares_the_problem_options():
    from pgc_mpi.runs.run_folder import differences

    cfg = config_from_args(["--problem", "quadratic", "--dim", "1000"])
    recorded = {"config": cfg.to_dict(), "workers": 4}
    assert differences(cfg, 4, recorded) == []
    assert differences(config_from_args(["--problem", "quadratic", "--dim", "999"]), 4, recorded) == \
        ["dim 1000 (this run: 999)"]
    changed = differences(config_from_args([]), 4, recorded)
    assert "problem 'quadratic' (this run: None)" in changed and "model None (this run: 'logreg')" in changed


def test_a_checkpoint_knows_its_problem(tmp_path):
    import torch

    from pgc_mpi.runs.checkpoint import CheckpointError, load, run_identity, save

    scheme = make_scheme("dgd", 2, 0)
    ident = {"dtype": "float64", "seed": 0, "optimizer": "sgd"}
    mine = run_identity(scheme, 10, model=None, dataset=None, problem="quadratic", samples=100, **ident)
    assert "model" not in mine and (mine["problem"], mine["samples"], mine["dim"]) == ("quadratic", 100, 10)
    params = torch.zeros(10, dtype=torch.float64, requires_grad=True)
    path = save(tmp_path, 3, params.detach().numpy(), torch.optim.SGD([params], lr=0.1).state_dict(), mine, {})
    assert load(path, mine).step == 3
    with pytest.raises(CheckpointError, match="for samples = 100, this run has 200"):
        load(path, {**mine, "samples": 200})
    with pytest.raises(CheckpointError, match="has no model: it is for another kind of run"):
        load(path, run_identity(scheme, 10, model="logreg", dataset="digits", **ident))


def test_a_rank_record_says_whether_torch_is_loaded():
    code = ("import json; from pgc_mpi.job import provenance; a = provenance.rank_record(); import torch; "
            "b = provenance.rank_record(); print(json.dumps([a, b]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, after = json.loads(proc.stdout)
    assert not before["torch_loaded"] and after["torch_loaded"]
    assert 0 < before["rss_mib"] <= before["peak_rss_mib"] < after["peak_rss_mib"]


# --- under mpiexec -----------------------------------------------------------------------------

def test_workers_of_a_synthetic_problem_never_import_torch(tmp_path):
    """Each worker reports it itself: in config.json's provenance once its problem is built, and
    in its own log (--log-level debug) when it stops."""
    out = tmp_path / "run"
    # dgd: every worker computes every step's gradient, whatever the timing (a coded scheme with s = 1
    # of 2 workers may decide a step without the slower one, which then computes fewer)
    proc = run_train(3, ["--scheme", "dgd", "--problem", "quadratic", "--dim", "1000", "--steps", "5",
                         "--out", str(out), "--log-level", "debug", "--log-dir", str(tmp_path / "logs")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads((out / "config.json").read_text())["provenance"]["ranks"]
    assert len(ranks) == 3 and ranks[0]["torch_loaded"]  # the master uses torch's optimizers
    assert [r["torch_loaded"] for r in ranks[1:]] == [False, False], ranks
    assert all(r["rss_mib"] < ranks[0]["rss_mib"] for r in ranks[1:]), ranks
    for rank, record in enumerate(ranks[1:], start=1):
        log = (tmp_path / "logs" / f"rank-{rank}.log").read_text()
        assert f"stopped: 5 gradients computed; process {record['pid']}" in log and "torch not loaded" in log, log
        assert "torch loaded" not in log, log
    assert len(steps_of(out)) == 5 and events_of(out, "summary")[0]["status"] == "completed"


def test_a_float64_dgd_run_follows_gradient_descent(tmp_path):
    """Whole partitions: w_k - t = (1 - lr h)^k (w_0 - t), so each evaluation's loss is known exactly."""
    out = tmp_path / "run"
    steps, lr = 20, 0.5
    proc = run_train(3, ["--scheme", "dgd", "--problem", "quadratic", "--dim", "1000", "--samples", "100",
                         "--dtype", "float64", "--steps", str(steps), "--lr", str(lr), "--eval-every", "5",
                         "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    q = Quadratic(2, samples=100, dim=1000)
    h, t = _pattern(q)
    evals = events_of(out, "eval")
    assert [e["step"] for e in evals] == [4, 9, 14, 19]
    for e in evals:
        expected = 0.5 * np.sum(h * ((1 - lr * h) ** (e["step"] + 1) * t) ** 2)
        assert e["train_loss"] == pytest.approx(expected, rel=1e-9) and e["gap"] == e["train_loss"]
    losses = [e["train_loss"] for e in evals]
    assert losses == sorted(losses, reverse=True) and losses[-1] < 0.1 * q.loss(q.initial_params())
    assert "on quadratic (dim 1000, 100 samples)" in proc.stdout


def test_a_noisy_pgc_cr_run_is_replayed_exactly_by_the_simulator(tmp_path):
    """Minibatch noise seeded by (seed, partition, draw): the MPI run's parameters, step by step,
    are the simulator's replay of its arrivals on a Quadratic built here."""
    from pgc_mpi.sim.replaying import replay

    out = tmp_path / "run"
    proc = run_train(4, ["--scheme", "pgc-cr", "-s", "1", "--problem", "quadratic", "--dim", "300", "--samples", "90",
                         "--batch-size", "5", "--dtype", "float64", "--steps", "12", "--seed", "2", "--lr", "0.3",
                         "--record-params", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = replay(make_scheme("pgc-cr", 3, 1, seed=2), Quadratic(3, samples=90, dim=300, batch_size=5, seed=2),
                      steps_of(out), lr=0.3)
    got = np.load(out / "params.npy")
    assert got.shape == (13, 300) and np.abs(got - np.stack(expected)).max() < 1e-12


def test_problem_with_model_is_one_line_and_exit_status_2(tmp_path):
    proc = run_train(3, ["--problem", "quadratic", "--model", "mlp", "--out", str(tmp_path / "run")])
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if "pgc-train: error:" in line]
    assert lines == ["pgc-train: error: --problem quadratic (a synthetic problem) and --model mlp (a torch model on "
                     "a data set) exclude each other: give one kind or the other"], proc.stderr
