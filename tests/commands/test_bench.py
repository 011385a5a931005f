"""pgc-bench and pgc-plot: a tiny real experiment, figures computed from the metrics, bad files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from pgc_mpi.commands.bench import RunKey, aggregate, load_experiment, plan, run_options, run_toml, winners
from pgc_mpi.commands.bench import main as bench
from pgc_mpi.commands.plot import main as plot
from pgc_mpi.config import config_from_args
from pgc_mpi.core.message import MessageRecord
from pgc_mpi.core.stragglers import DelayModel
from pgc_mpi.errors import ConfigError
from pgc_mpi.runs.metrics import read_metrics
from pgc_mpi.runs.results import RunSummary, first_sustained, read_steps, realized_delays

EXPERIMENT = ('name = "tiny"\nworkers = 3\nschemes = ["dgd", "pgc-cr", "gc-fr"]\ns = [1]\nseeds = [0, 1]\n'
              'delays = ["exp:0.02", "none"]\ntarget_loss = 1.9\ntimeout = 120\n[train]\nsteps = 12\n'
              'eval-every = 4\nproblem = "quadratic"\n')  # no torch in the 32 ranks it starts


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    exp = root / "exp.toml"
    exp.write_text(EXPERIMENT)
    assert bench([str(exp), "--out", str(root / "out")]) == 0
    return root / "out"


def test_the_table_is_computed_from_the_metrics(experiment):
    rows = {(r["scheme"], r["delay"], r["seed"]): r for r in csv.DictReader((experiment / "results.csv").open())}
    # gc-fr cannot run on 3 workers with s=1 and is skipped; 2 seeds x 2 delay models of the others
    assert sorted(rows) == sorted((scheme, delay, seed) for scheme in ("dgd", "pgc-cr")
                                  for delay in ("exp:0.02", "none") for seed in ("0", "1"))
    for (scheme, delay, seed), row in rows.items():
        run = experiment / f"{scheme}-s1-d{['exp:0.02', 'none'].index(delay)}-seed{seed}"
        steps = read_steps(run)
        assert float(row["median_step_time"]) == pytest.approx(float(np.median([r["step_time"] for r in steps])))
        wasted = sum(m.gradients for r in steps for m in map(MessageRecord._make, r["messages"]) if m.verdict != "used")
        assert int(row["wasted_gradients"]) == wasted
        dgd = rows[("dgd", delay, seed)]  # the ratio is paired: dgd's run with the same seed and delay model
        assert float(row["step_time_vs_dgd"]) == pytest.approx(float(row["median_step_time"])
                                                               / float(dgd["median_step_time"]))
    text = (experiment / "results.md").read_text()
    assert "### delay exp:0.02" in text and "### delay none" in text and "95% confidence interval" in text
    assert "| pgc-cr | 1 | 2 |" in text and "## Who reaches the target first" in text


def test_a_sweep_reuses_finished_runs_and_refuses_changed_ones(experiment, tmp_path, capsys):
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT)
    assert bench([str(exp), "--out", str(experiment)]) == 0
    out = capsys.readouterr().out
    assert out.count("finished before, reused") == 8
    exp.write_text(EXPERIMENT.replace("steps = 12", "steps = 13"))
    assert bench([str(exp), "--out", str(experiment)]) == 2
    assert "holds a finished run with other options" in capsys.readouterr().err
    exp.write_text(EXPERIMENT.replace('problem = "quadratic"', 'dataset = "nowhere.h5"'))
    assert bench([str(exp), "--out", str(tmp_path / "new")]) == 2
    assert "data file nowhere.h5 does not exist" in capsys.readouterr().err


def test_figures_are_written_and_pgc_plot_redraws_them(experiment, tmp_path):
    for name in ("loss_vs_steps.png", "loss_vs_time.png", "step_times.png", "staleness.png", "time_vs_dgd.png"):
        assert (experiment / name).stat().st_size > 5000
    # a run that did not complete is drawn (marked), not dropped
    import shutil

    killed = tmp_path / "runs" / "killed"
    shutil.copytree(experiment / "pgc-cr-s1-d0-seed0", killed)
    lines = (killed / "metrics.jsonl").read_text().splitlines()
    (killed / "metrics.jsonl").write_text("\n".join(line for line in lines if '"summary"' not in line) + "\n")
    assert plot([str(tmp_path / "runs"), "--out", str(tmp_path / "marked")]) == 0
    assert (tmp_path / "marked" / "loss_vs_time.png").stat().st_size > 5000
    assert plot([str(experiment), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "loss_vs_time.png").stat().st_size > 5000
    assert plot([str(tmp_path / "nothing")]) == 2


def test_realized_delays_replay_the_run(experiment):
    config = json.loads((experiment / "pgc-cr-s1-d0-seed0" / "config.json").read_text())["config"]
    model = DelayModel(config["delay"], 3, seed=config["seed"])
    trace = realized_delays(experiment / "pgc-cr-s1-d0-seed0")
    assert len(trace) > 12
    assert all(d == pytest.approx(model.delay(w, s), abs=1e-9) for w, s, d in trace)  # kept to the nanosecond


def test_bad_experiment_files(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('workers = 3\nschemes = ["dgd"]\ncolour = "red"\n')
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        load_experiment(f)
    f.write_text('workers = "three"\nschemes = ["dgd"]\n')
    with pytest.raises(ConfigError, match="'workers' must be a int"):
        load_experiment(f)
    f.write_text('workers = 3\nschemes = ["dgd"]\n[train]\nscheme = "gc-cr"\n')
    with pytest.raises(ConfigError, match="per-run options"):
        load_experiment(f)
    f.write_text('workers = 4\nschemes = ["dgd", "gc-fr", "nope"]\ns = [1, 2]\n')
    reasons = {(key.scheme, key.s): reason for key, reason in plan(load_experiment(f))}
    assert reasons[("dgd", 1)] is None and reasons[("gc-fr", 1)] is None
    assert "divisible" in reasons[("gc-fr", 2)] and "unknown scheme" in reasons[("nope", 1)]
    assert bench([str(tmp_path / "missing.toml")]) == 2


def test_per_scheme_options_apply_to_that_scheme_only(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('workers = 4\nschemes = ["dgd", "pgc-cr", "pbs", "is-gc-cr"]\ns = [1, 2]\n'
                 '[train]\nmax-staleness = "none"\n[per_scheme.pbs]\nreplication = 2\nc = 4\nadapt = true\n')
    exp = load_experiment(f)
    assert run_options(exp, RunKey("pbs", 1, 0, 0)) == {"max_staleness": "none", "replication": 2, "c": 4,
                                                        "adapt": True, "scheme": "pbs", "stragglers": 1, "seed": 0,
                                                        "delay": "none"}
    assert run_options(exp, RunKey("pgc-cr", 2, 0, 0)) == {"max_staleness": "none", "scheme": "pgc-cr",
                                                           "stragglers": 2, "seed": 0, "delay": "none"}
    runs = {(key.scheme, key.s): reason for key, reason in plan(exp)}
    # dgd and pbs ignore s: one run per seed; every run is valid (is-gc-cr's c defaults to 2)
    assert sorted(runs) == [("dgd", 1), ("is-gc-cr", 1), ("is-gc-cr", 2), ("pbs", 1), ("pgc-cr", 1), ("pgc-cr", 2)]
    assert all(reason is None for reason in runs.values())
    f.write_text('workers = 4\nschemes = ["pbs"]\n[per_scheme.pbz]\nc = 4\n')
    with pytest.raises(ConfigError, match=r"\[per_scheme.pbz\]: unknown scheme"):
        load_experiment(f)
    f.write_text('workers = 4\nschemes = ["pbs"]\n[per_scheme.pbs]\nseed = 4\n')
    with pytest.raises(ConfigError, match=r"\[per_scheme.pbs\] has unknown or per-run options \['seed'\]"):
        load_experiment(f)


def _summary(scheme: str, seed: int, time: float | None, s: int = 1) -> RunSummary:
    return RunSummary(run=f"{scheme}-{seed}", scheme=scheme, s=s, delay="exp:1", seed=seed, steps=10,
                      median_step_time=1.0, step_time_vs_dgd=None, steps_to_target=5 if time else None,
                      time_to_target=time, steps_to_target_decoded=None, time_to_target_decoded=None,
                      final_test_accuracy=0.9, utilization=0.5, wasted_gradients=0,
                      bytes_per_step=1e6, max_staleness=0, mean_staleness=0.0)


def test_who_wins_is_decided_by_the_paired_interval():
    clear = [_summary("dgd", k, 10.0 + k) for k in range(4)] + [_summary("pgc-cr", k, 5.0 + k) for k in range(4)]
    lines = winners(aggregate(clear), clear)
    assert lines[2] == "| exp:1 | 1 | pgc-cr | dgd (+5 [5, 5]) | yes |"
    rows = {r["scheme"]: r for r in aggregate(clear)}
    assert rows["pgc-cr"]["time_vs_dgd"].mean == pytest.approx(np.mean([5 / 10, 6 / 11, 7 / 12, 8 / 13]))
    noisy = ([_summary("dgd", k, t) for k, t in enumerate([10.0, 4.0, 9.0, 5.0])]
             + [_summary("pgc-cr", k, t) for k, t in enumerate([6.0, 8.0, 5.0, 7.0])])
    assert winners(aggregate(noisy), noisy)[2].endswith("| no (within noise) |")
    never = [_summary("dgd", 0, None), _summary("pgc-cr", 0, None)]
    assert "no scheme reached the target" in winners(aggregate(never), never)[2]


def test_the_simulator_backend_writes_runs_the_gather_reads(tmp_path, capsys):
    from pgc_mpi.config import SimConfig
    from pgc_mpi.learning.torch_problem import load_problem
    from pgc_mpi.sim.simulator import simulate

    exp = tmp_path / "sim.toml"
    exp.write_text('name = "sim"\nworkers = 4\nbackend = "sim"\nschemes = ["dgd", "pgc-cr", "ddp"]\ns = [1]\n'
                   'seeds = [0, 1]\ntarget_loss = 1.5\n[train]\nsteps = 20\neval_every = 5\ncompute_time = 1.0\n'
                   'delay = "exp:1.0"\n')
    assert bench([str(exp), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "skipping ddp s=1 seed=0: scheme 'ddp' runs only under pgc-train" in captured.err
    config = json.loads((tmp_path / "out" / "pgc-cr-s1-seed1" / "config.json").read_text())
    assert config["backend"] == "sim" and config["config"]["dataset"] == "digits"
    # the run folder holds exactly the simulated run
    direct = simulate(SimConfig(scheme="pgc-cr", workers=4, stragglers=1, steps=20, eval_every=5, compute_time=1.0,
                                delay="exp:1.0", seed=1), load_problem("digits", "logreg", 4, 32, seed=1))
    rows = {(r["scheme"], r["seed"]): r for r in csv.DictReader((tmp_path / "out" / "results.csv").open())}
    assert float(rows[("pgc-cr", "1")]["median_step_time"]) == pytest.approx(direct.median_step_time())
    assert "## Who reaches the target first" in (tmp_path / "out" / "results.md").read_text()
    # the paper's stopping rule on the decoded loss of the same records, and its paired ratio to dgd
    hit = first_sustained(direct.records, 1.5)
    assert hit is not None and int(rows[("pgc-cr", "1")]["steps_to_target_decoded"]) == hit["step"] + 1
    assert float(rows[("pgc-cr", "1")]["time_to_target_decoded"]) == pytest.approx(hit["wall_time"])
    assert "## Steps to target under both stopping rules" in (tmp_path / "out" / "results.md").read_text()
    exp.write_text(exp.read_text().replace("compute_time = 1.0\n", ""))
    assert bench([str(exp), "--out", str(tmp_path / "other")]) == 1  # nothing could run
    assert 'backend "sim" needs compute_time' in capsys.readouterr().err


def test_the_papers_stopping_rule_needs_three_consecutive_steps():
    losses = [2.0, 0.9, 0.8, 1.1, 0.7, float("nan"), 0.6, 0.5, 0.4, 0.3]
    steps = [{"step": k, "wall_time": 10.0 * k, "train_loss": v} for k, v in enumerate(losses)]
    assert first_sustained(steps, 1.0)["step"] == 8  # 1, 2 broken by 1.1; 4 broken by the NaN; 6, 7, 8
    assert first_sustained(steps, 1.0, run=2)["step"] == 2
    assert first_sustained(steps, 0.35) is None and first_sustained([], 1.0) is None


def test_ratios_to_dgd_are_paired_under_both_rules():
    rows = []
    for seed, (dgd_steps, pgc_steps) in enumerate([(10, 5), (20, 15)]):
        for scheme, steps in (("dgd", dgd_steps), ("pgc-cr", pgc_steps)):
            rows.append(RunSummary(**{**_summary(scheme, seed, float(steps)).as_row(), "steps_to_target": steps,
                                      "steps_to_target_decoded": steps + 2, "time_to_target_decoded": steps * 1.0}))
    pgc = next(r for r in aggregate(rows) if r["scheme"] == "pgc-cr")
    assert pgc["steps_vs_dgd"].mean == pytest.approx((5 / 10 + 15 / 20) / 2)
    assert pgc["steps_vs_dgd_decoded"].mean == pytest.approx((7 / 12 + 17 / 22) / 2)
    assert pgc["reached_decoded"] == 2


def test_waiting_saved_is_the_slowest_job_minus_the_slowest_used_one():
    from pgc_mpi.runs.results import waiting_saved

    def msg(worker, step, delay, verdict):  # MessageRecord: worker, step, delay, compute_time, gradients, verdict
        return [worker, step, delay, 1.0, 1, verdict]

    steps = [{"step": 0, "messages": [msg(0, 0, 0.0, "used"), msg(1, 0, 0.5, "used")]},
             {"step": 1, "messages": [msg(2, 0, 2.0, "late"), msg(0, 1, 0.2, "used"), msg(1, 1, 0.1, "used"),
                                      msg(2, 1, 3.0, "accepted")]},
             {"step": 2, "messages": [msg(0, 2, 0.0, "used"), msg(1, 2, 0.0, "used")]}]
    est = waiting_saved(steps, workers=3)
    # step 0: worker 2's late job 3.0 s against 1.5 s used; step 1: 4.0 against 1.2; step 2: nothing from
    # worker 2 (hung, say): 0, a lower bound
    assert est.seconds == pytest.approx((3.0 - 1.5) + (4.0 - 1.2))
    assert (est.steps, est.steps_complete) == (3, 2)
    assert waiting_saved([{"step": 0, "ages": [0], "messages": []}], 3) is None  # pbs: not estimated


def test_experiment_files_name_your_model_loss_and_data(tmp_path):
    """pgc-bench's [train] takes model, loss and dataset as PATH:NAME (simulated here; the MPI backend
    hands them to pgc-train in the run's TOML file, as tests/runtime/test_examples_mpiexec.py's flags)."""
    nets = Path(__file__).resolve().parents[2] / "examples" / "nets.py"
    exp = tmp_path / "mine.toml"
    exp.write_text(f'name = "mine"\nworkers = 2\nbackend = "sim"\nschemes = ["dgd", "pgc-cr"]\ns = [1]\n'
                   f'seeds = [0]\n[train]\nsteps = 6\neval_every = 3\ncompute_time = 0.01\n'
                   f'model = "{nets}:make_model"\nloss = "{nets}:focal_loss"\ndataset = "{nets}:digits"\n')
    assert bench([str(exp), "--out", str(tmp_path / "out")]) == 0
    for scheme in ("dgd", "pgc-cr"):
        run = tmp_path / "out" / f"{scheme}-s1-seed0"
        config = json.loads((run / "config.json").read_text())
        assert config["config"]["loss"] == f"{nets}:focal_loss" and config["parameters"] == 2730
        assert [r for r in read_metrics(run / "metrics.jsonl") if r.get("event") == "summary"][0]["steps"] == 6
    # the MPI backend's run file: pgc-train reads the same three options from it
    toml = tmp_path / "run.toml"
    toml.write_text(run_toml(load_experiment(exp), RunKey("pgc-cr", 1, 0, 0)))
    cfg = config_from_args(["--config", str(toml)])
    assert (cfg.model, cfg.loss, cfg.dataset) == (f"{nets}:make_model", f"{nets}:focal_loss", f"{nets}:digits")


def test_runs_with_lost_detail_are_named_by_pgc_bench_and_pgc_plot(experiment, tmp_path, capsys):
    import shutil

    from pgc_mpi.runs.message_log import DetailLostWarning

    out = tmp_path / "out"
    shutil.copytree(experiment, out)
    run = out / "pgc-cr-s1-d0-seed0"
    data = (run / "messages.bin").read_bytes()
    (run / "messages.bin").write_bytes(data[:len(data) // 2])  # a copy cut short
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT)
    with pytest.warns(DetailLostWarning):
        assert bench([str(exp), "--out", str(out), "--gather"]) == 0
    err = capsys.readouterr().err
    assert f"pgc-bench: {run.name}: the per-message detail of " in err and "of 12 steps is lost" in err
    text = (out / "results.md").read_text()
    assert "## Runs with lost per-message detail" in text and f"- {run.name}: " in text
    rows = {r["run"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert int(rows[run.name]["steps_detail_lost"]) > 0 and rows["dgd-s1-d0-seed0"]["steps_detail_lost"] == "0"
    with pytest.warns(DetailLostWarning):
        assert plot([str(run), str(out / "dgd-s1-d0-seed0"), "--out", str(tmp_path / "fig")]) == 0
    err = capsys.readouterr().err
    assert f"pgc-plot: {run.name}: the per-message detail" in err and "dgd-s1-d0-seed0:" not in err
