"""pgc-advise: the recommendation rule on constructed results, the probe read back, the table and
--json agreeing, the commands that run the advice, and every bad input as one line and exit
status 2. Probes here are simulated run folders (no MPI): a synthetic problem written as
pgc-train writes its run, and pgc-bench's sim backend on digits; the mpiexec probes are in
test_advise_mpiexec.py."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from pgc_mpi.commands import advise_report
from pgc_mpi.commands.advise import main
from pgc_mpi.config import SimConfig, TrainConfig
from pgc_mpi.learning.problems import PROBLEMS
from pgc_mpi.runs.metrics import MetricsWriter, write_json
from pgc_mpi.runs.probe import MIN_STEPS, read_probe
from pgc_mpi.runs.stats import Interval, interval
from pgc_mpi.sim.advice import Target, replay
from pgc_mpi.sim.recommend import CandidateResult, recommend, simplicity

PROBE_ARGS = ["--problem", "least-squares", "--scheme", "dgd", "--steps", "50", "--compute-time", "0.02",
              "--delay", "exp:0.05", "--eval-every", "5"]


def train_probe(out: Path) -> Path:
    """A real probe: pgc-train with PROBE_ARGS under mpiexec (4 workers, bounded) into `out`."""
    from helpers import run_train

    proc = run_train(5, [*PROBE_ARGS, "--out", str(out)], timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def write_probe(out: Path, steps: int = 50, scheme: str = "dgd", program: str = "pgc-train", **options) -> Path:
    """A probe run folder as pgc-train writes it, its records simulated: least-squares on 4
    workers, 20 ms per gradient, exp(50 ms) delays."""
    from pgc_mpi.sim.simulator import simulate

    sim = SimConfig(scheme=scheme, workers=4, steps=steps, compute_time=0.02, delay="exp:0.05", eval_every=5)
    result = simulate(sim, PROBLEMS["least-squares"](4, samples=1200, dim=20, seed=0))
    train = TrainConfig(problem="least-squares", scheme=scheme, steps=steps, compute_time=0.02, delay="exp:0.05",
                        eval_every=5, out=str(out), **options)
    out.mkdir(parents=True)
    write_json(out / "config.json", {"config": train.to_dict(), "workers": 4, "provenance": {
        "program": program, "command_line": ["pgc-train", *PROBE_ARGS, "--out", str(out)]}})
    metrics = MetricsWriter(out)
    evals = {e["step"]: e for e in result.evals}
    for record in result.records:
        metrics.write(record)
        if record["step"] in evals:
            metrics.write({"event": "eval", **{k: v for k, v in evals[record["step"]].items() if k != "wall_time"}})
    metrics.write({"event": "summary", "status": "completed"})
    metrics.close()
    return out


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    return write_probe(tmp_path_factory.mktemp("advise") / "probe")


def result(scheme: str, s: int | None, times: list[float | None]) -> CandidateResult:
    reached = [t for t in times if t is not None]
    return CandidateResult(scheme, s, len(times), len(reached), interval(reached), interval([10.0] * len(reached)),
                           interval([1.0] * len(times)), times=tuple(math.inf if t is None else t for t in times))


# --- the rule ------------------------------------------------------------------------------------------

def test_a_lead_outside_the_noise_is_recommended():
    fast, slow = result("pgc-cr", 2, [5.0, 5.2, 5.1]), result("dgd", None, [9.0, 9.3, 9.1])
    advice = recommend([slow, fast])
    assert advice.choice == fast and advice.clear and "lead outside the noise" in advice.describe()


def test_a_tie_goes_to_the_simplest_of_the_candidates_tied_with_the_fastest_seed_by_seed():
    pgc = result("pgc-fr", 1, [5.0, 6.0, 5.5])
    # paired ratios to pgc-fr: 1.02, 0.983, 1.018 and 0.98, 1.033, 1.018: within 5% of 1, holding it
    isgd2, isgd1 = result("is-sgd", 2, [5.1, 5.9, 5.6]), result("is-sgd", 1, [4.9, 6.2, 5.6])
    gc = result("gc-cr", 1, [20.0, 21.0, 20.5])  # far behind: not in the tie
    advice = recommend([gc, pgc, isgd2, isgd1])
    assert not advice.clear and advice.fastest == pgc
    assert set(advice.tie) == {pgc, isgd1, isgd2} and advice.choice == isgd1  # is-sgd < pgc; then the smaller s
    assert "tie within the noise" in advice.describe() and "is-sgd s=1 is the simplest" in advice.describe()


def test_only_candidates_that_reached_the_target_on_every_seed_count():
    partial = result("pgc-fr", 1, [1.0, None, 1.1])
    whole = result("dgd", None, [9.0, 9.5, 9.2])
    assert recommend([partial, whole]).choice == whole
    assert recommend([partial, result("gc-cr", 1, [None, None, None])]) is None


def test_one_seed_has_no_spread_the_fastest_wins_outright():
    a, b = result("pgc-cr", 1, [5.0]), result("dgd", None, [5.01])
    assert math.isnan(a.time.low) and math.isnan(b.ratio_to(a).low)
    assert recommend([b, a]).choice == a and recommend([b, a]).clear


def test_the_order_of_simplicity():
    names = [("pbs", None), ("pgc-cr", 1), ("pgc-fr", 2), ("pgc-fr", 1), ("is-gc-cr", 1), ("is-gc-fr", 1),
             ("gc-cr", 1), ("gc-fr", 3), ("is-sgd", 2), ("is-sgd", 1), ("dgd", None)]
    assert sorted(names, key=lambda n: simplicity(*n)) == list(reversed(names))


# --- the probe, the delays, the commands --------------------------------------------------------------

def test_the_probe_is_read_back(probe):
    p = read_probe(probe)
    assert p.scheme == "dgd" and p.workers == 4 and p.program == "pgc-train" and not p.from_fit
    assert p.steps_measured == 45 and p.delays.overall.count == 4 * 45
    assert p.compute == {w: pytest.approx(0.02) for w in range(4)} and p.compute_time() == pytest.approx(0.02)
    assert p.master == {}  # the simulated master took no time
    assert p.last_eval["step"] == 49 and "train_loss" in p.last_eval
    assert "4 workers, 45 steps measured" in p.describe()
    assert p.data_wait == {} and "data wait" not in p.describe()  # the simulator records none


@pytest.mark.parametrize("loaders,waits,says", [
    (0, {0: 0.04, 1: 0.02}, "Loader processes (--loader-workers 2) would read it ahead"),
    ("auto", {0: 0.04, 1: 0.02}, "needs more --loader-workers"),
    (0, {0: 0.001, 1: 0.002}, None),
])
def test_a_probes_data_wait_is_told_apart_from_slow_nodes(loaders, waits, says):
    """A data wait of 20 % of the compute or more is named as the data pipeline's, with what to do."""
    from pgc_mpi.runs.probe import Probe

    p = Probe(path=Path("probe"), options={"scheme": "dgd", "loader_workers": loaders}, workers=2,
              program="pgc-train", command_line=(), delays=None, steps_measured=40, compute={0: 0.1, 1: 0.1},
              data_wait=waits)
    assert p.data_wait_share() == pytest.approx(sum(waits.values()) / 0.2)
    line = p.describe_data_wait()
    assert f"({100 * p.data_wait_share():.0f}% of the compute)" in line
    assert ("not by slow nodes" in line) == (says is not None) and (says is None or says in line)


def test_the_trace_replays_the_probe_then_blocks_of_it(probe, tmp_path):
    """Seed 0: each worker's measured extras in order, cycled; seed 1: blocks of 10 consecutive
    measured steps drawn at random, the same blocks for every worker."""
    p = read_probe(probe)
    delays = replay(p, "trace", 100, 3, tmp_path)
    assert delays.used == "trace" and len(delays.specs) == 3 and "cycled" in delays.note
    mine = {w: [max(0.0, x) for _, x in sorted((e.step, e.extra) for e in p.delays.extras if e.worker == w)]
            for w in range(4)}

    def trace(k: int) -> dict[int, list[float]]:
        rows = (tmp_path / f"trace-seed{k}.csv").read_text().splitlines()
        assert rows[0] == "worker,step,delay" and len(rows) == 1 + 4 * 100
        cells = {(int(w), int(t)): float(d) for w, t, d in (r.split(",") for r in rows[1:])}
        return {w: [cells[w, t] for t in range(100)] for w in range(4)}

    first = trace(0)
    assert all(first[w] == pytest.approx([mine[w][t % 45] for t in range(100)], abs=1e-6) for w in range(4))
    second = trace(1)
    for block in range(10):
        start = mine[0].index(pytest.approx(second[0][10 * block], abs=1e-6))
        for w in range(4):  # every worker replays the same 10 consecutive measured steps
            assert second[w][10 * block:10 * block + 10] == pytest.approx(
                [mine[w][(start + j) % 45] for j in range(10)], abs=1e-6)
    assert second != first
    cfg = SimConfig(scheme="gc-cr", workers=4, stragglers=1)
    slow = type(delays)(delays.used, delays.specs, {0: 0.0, 3: 0.01}, delays.note)
    assert slow.spec(2, cfg) == f"{delays.specs[2]}+fixed:3:0.02"  # gc-cr computes c = 2 gradients a step
    fitted = replay(p, "fit", 100, 2, tmp_path / "none")
    assert fitted.specs == (p.delays.fit.spec,) * 2 and not (tmp_path / "none").exists()


def test_the_commands_keep_the_probes_options_and_replace_the_scheme(probe):
    p = read_probe(probe)
    choice = result("pgc-cr", 2, [1.0])
    assert advise_report.kept_flags(("pgc-train", "--scheme=dgd", "-s2", "--steps", "60", "--overwrite", "--lr",
                                     "0.1", "--out", "x", "--stragglers", "3", "--no-adapt")) == ["--lr", "0.1"]
    lines = advise_report.train_commands(p, choice)
    flags = "--problem least-squares --compute-time 0.02 --delay exp:0.05 --eval-every 5 --scheme pgc-cr -s 2"
    assert lines == [f"pgc-train flags: {flags}", f"launch/local.sh 4 {flags}",
                     f"sbatch -n 5 --export=ALL,PGC_VENV=$VIRTUAL_ENV launch/slurm/train.sbatch {flags}"]


# --- end to end ---------------------------------------------------------------------------------------

ADVISE = ["--target-loss", "0.005", "--schemes", "dgd,is-sgd,pgc-cr,pgc-fr", "--s", "1,2", "--seeds", "2"]


def parse_table(text: str) -> dict[str, list[str]]:
    """The printed table's rows by candidate name (columns split on runs of 2+ spaces)."""
    import re

    lines = text.splitlines()
    head = next(k for k, line in enumerate(lines) if re.match(r"scheme\s{2,}s\s{2,}reached", line))
    rows = {}
    for line in lines[head + 1:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0] + ("" if cells[1] == "-" else f" s={cells[1]}")] = cells
    return rows


def test_the_table_and_json_agree_and_follow_the_rule(probe, capsys, tmp_path):
    assert main([str(probe), *ADVISE, "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert main([str(probe), *ADVISE, "--out", str(tmp_path / "advice")]) == 0
    printed = capsys.readouterr().out
    assert_agree(advice, printed)
    assert advice["used"] == "trace" and advice["delays"]["messages"] == 180
    rec = advice["recommended"]
    assert advice["start_seeds"] == 2 and advice["max_seeds"] == 8 and rec["margin"] == 0.05  # --max-seeds: 4x
    assert rec["seed_rounds"][0] == 2 and advice["seeds"] == rec["seed_rounds"][-1] <= 8
    assert all(r["seeds"] in rec["seed_rounds"] for r in advice["candidates"])
    assert rec["settled"] == (not rec["unsure"]) and (rec["note"] == "") == (rec["settled"] and
                                                                            len(rec["seed_rounds"]) == 1)
    chosen_row = next(r for r in advice["candidates"] if r["recommended"])
    assert chosen_row["ratio"] == 1 and chosen_row["verdict"] in ("fastest", "tie")
    fr = ("pgc-fr needs n divisible by c = 3 (fractional repetition), got n=4: use a multiple of 3 workers or the "
          "cyclic variant pgc-cr (with 4 workers)")
    assert advice["skipped"][1:] == [f"pgc-fr s=2{flags}: {fr}" for flags in
                                     ("", " --abandon-late", " --max-staleness none", " --staleness-correction none")]
    # the options are candidates of their own: DropCompute needs micro-batches the probe did not have
    assert advice["skipped"][0].startswith("dgd --drop-compute auto: --drop-compute") and "accumulate" in \
        advice["skipped"][0]
    assert {r["flags"] for r in advice["candidates"] if r["scheme"] == "is-sgd"} == {"", "--abandon-late"}
    # the pipelined schemes' own: the staleness bound left, the paper's estimator; marked as such
    pgc = [r for r in advice["candidates"] if r["scheme"] == "pgc-fr"]
    assert {r["flags"] for r in pgc} == {"", "--abandon-late", "--max-staleness none", "--staleness-correction none"}
    marks = {r["flags"]: parse_table(printed)[f"pgc-fr {r['flags']} s=1".replace("  ", " ")][-1] for r in pgc
             if r["flags"].startswith("--max") or r["flags"].startswith("--stal")}
    assert "leaves the paper's staleness bound" in marks["--max-staleness none"]
    assert "the paper's estimator" in marks["--staleness-correction none"]
    written = {p.name for p in (tmp_path / "advice").iterdir()}
    assert {"advice.md", "advice.csv", "trace-seed0.csv", "trace-seed1.csv"} <= written
    assert "<- recommended" in (tmp_path / "advice" / "advice.md").read_text()


def assert_agree(advice: dict, printed: str) -> None:
    """The printed table says what --json says, and the recommendation is the rule's."""
    table = parse_table(printed)
    assert len(table) == len(advice["candidates"])
    for row in advice["candidates"]:
        name = " ".join([row["scheme"], *([row["flags"]] if row["flags"] else [])]) + (
            "" if row["s"] is None else f" s={row['s']}")
        cells = table[name]
        assert cells[2] == f"{row['reached']}/{row['seeds']}"
        assert float(cells[3].split(" [")[0]) == pytest.approx(row["time_to_target"], rel=1e-3)
        assert float(cells[4]) == pytest.approx(row["steps_to_target"], rel=1e-3)
        assert float(cells[5]) == pytest.approx(row["step_time"], rel=1e-3)
        marks = cells[9] if len(cells) > 9 else ""  # the verdict, then what the options mean ("; "-joined)
        assert ("<- recommended" in marks.split("; ")) == row["recommended"]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3g}"
        assert cells[8].split(" [")[0] == ratio
    rebuilt = [CandidateResult(r["scheme"], r["s"], r["seeds"], r["reached"],
                               Interval(*(math.nan if r[k] is None else r[k] for k in
                                          ("time_to_target", "time_low", "time_high")), r["reached"]),
                               interval([]), interval([]),
                               times=tuple(math.inf if t is None else t for t in r["times"]),
                               flags=tuple(r["flags"].split()))
               for r in advice["candidates"]]
    chosen = recommend(rebuilt).choice
    rec = advice["recommended"]
    assert (rec["scheme"], rec["s"], tuple(rec["flags"])) == (chosen.scheme, chosen.s, chosen.flags)
    chosen_row = next(r for r in advice["candidates"] if r["recommended"])
    assert (chosen_row["scheme"], chosen_row["s"], chosen_row["flags"]) == (chosen.scheme, chosen.s,
                                                                            " ".join(chosen.flags))
    flags = " ".join([f"--scheme {chosen.scheme}", *([] if chosen.s is None else [f"-s {chosen.s}"]), *chosen.flags])
    assert all(line.endswith(flags) for line in advice["recommended"]["commands"])
    assert advice["recommended"]["why"] in printed


def test_the_fitted_delay_model_is_used_when_asked_and_no_figure_without_matplotlib(probe, capsys, tmp_path,
                                                                                   monkeypatch):
    from pgc_mpi.commands import plot

    monkeypatch.setattr(plot, "have_matplotlib", lambda: False)
    assert main([str(probe), "--target-loss", "0.005", "--schemes", "dgd", "--seeds", "1", "--delay-model", "fit",
                 "--json", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    advice = json.loads(captured.out)
    assert "pgc-advise: no figure: it needs matplotlib: pip install 'pgc-mpi[plot]'" in captured.err
    assert (tmp_path / "advice.csv").is_file() and not (tmp_path / "advice.png").exists()
    assert advice["used"] == "fit" and advice["recommended"] == {**advice["recommended"], "scheme": "dgd", "s": None}
    assert advice["delays"]["replayed"].startswith("the fitted --delay ")


# --- bad input: one line, exit status 2 ---------------------------------------------------------------

def refused(capsys, argv: list[str]) -> str:
    """The one error line (after the simulations' progress lines, where it ran some)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("pgc-advise")]
    assert len(errors) == 1 and err[-1] == errors[0] and errors[0].startswith("pgc-advise: error: "), err
    assert all(line.startswith(("built the", "simulated ")) for line in err[:-1]), err
    return errors[0]


def test_a_folder_that_is_not_a_run(capsys, tmp_path):
    assert "not a run folder (no config.json)" in refused(capsys, [str(tmp_path), "--target-loss", "1"])


def test_a_missing_or_double_target_names_what_the_probe_reached(capsys, probe):
    line = refused(capsys, [str(probe)])
    assert "give one target, --target-loss L or --target-accuracy A (the probe reached train_loss" in line
    assert "give one target" in refused(capsys, [str(probe), "--target-loss", "1", "--target-accuracy", "0.5"])
    assert "report no accuracy" in refused(capsys, [str(probe), "--target-accuracy", "0.9"])


def test_a_run_too_short(capsys, tmp_path):
    short = write_probe(tmp_path / "short", steps=20)
    line = refused(capsys, [str(short), "--target-loss", "1"])
    assert f"15 steps with messages past the first 5; needs at least {MIN_STEPS} steps past the first 5" in line


def test_a_ddp_run(capsys, probe, tmp_path):
    ddp = tmp_path / "ddp"
    shutil.copytree(probe, ddp)
    config = json.loads((ddp / "config.json").read_text())
    config["config"]["scheme"] = "ddp"
    (ddp / "config.json").write_text(json.dumps(config))
    assert "is a ddp run: it records no messages" in refused(capsys, [str(ddp), "--target-loss", "1"])


def test_a_target_no_candidate_reaches(capsys, probe):
    line = refused(capsys, [str(probe), "--target-loss", "0.001", "--schemes", "dgd,pgc-cr", "--s", "1",
                            "--seeds", "1", "--max-steps", "30"])
    assert ("target loss <= 0.001 not reached by any candidate in 30 simulated steps: choose a target the probe's "
            "model can reach, e.g. the loss it reached (0.004") in line


def test_a_fit_run_needs_its_model_and_data_as_plug_ins(capsys, tmp_path):
    from pgc_mpi.sim.advice import base_options, problem_choice

    fit = tmp_path / "fit"
    write_probe(fit, program="pgc_mpi.fit")
    config = json.loads((fit / "config.json").read_text())
    config["config"].update(problem=None, samples=None, dim=None, model="__main__:make_model", dataset="arrays",
                            loss=None, batch_size=32)
    (fit / "config.json").write_text(json.dumps(config))
    line = refused(capsys, [str(fit), "--target-loss", "1"])
    assert ("was trained by pgc_mpi.fit, whose model, data and loss are Python objects that config.json names only "
            "by label: give them to pgc-advise as plug-ins, --model PATH:NAME (config.json: __main__:make_model), "
            "--dataset PATH:NAME (config.json: arrays)") in line
    chosen = problem_choice(read_probe(fit), model="examples/nets.py:make_model", dataset="digits")
    # its recipe's factories likewise: the simulator builds the update pgc-train's master builds
    config["config"].update(optimizer="__main__:make_optimizer", scheduler="__main__:make_scheduler")
    (fit / "config.json").write_text(json.dumps(config))
    line = refused(capsys, [str(fit), "--target-loss", "1", "--model", "examples/nets.py:make_model",
                            "--dataset", "digits"])
    assert ("the probe's optimizer __main__:make_optimizer was a Python object given to pgc_mpi.fit, which "
            "config.json names only by label: give it to pgc-advise as --optimizer PATH:NAME") in line
    base = base_options(read_probe(fit), 100, 10, 0.1, None, Target("loss", 1.0), "recipe.py:opt", "recipe.py:sched")
    assert (base["optimizer"], base["scheduler"]) == ("recipe.py:opt", "recipe.py:sched")
    assert (chosen.model, chosen.dataset, chosen.loss) == ("examples/nets.py:make_model", "digits", None)
    config["provenance"] = {}  # a folder written before provenance named its program: fit's labels tell
    (fit / "config.json").write_text(json.dumps(config))
    assert read_probe(fit).from_fit


def test_other_bad_options(capsys, probe):
    assert "--schemes: ddp" in refused(capsys, [str(probe), "--target-loss", "1", "--schemes", "ddp"])
    assert "--model: the probe trained the synthetic" in refused(capsys, [str(probe), "--target-loss", "1",
                                                                          "--model", "logreg"])
    assert "no such file" in refused(capsys, [str(probe), "--target-loss", "1", "--master-cost", "/no/such.json"])
    assert "--max-seeds 2 is below --seeds 3" in refused(capsys, [str(probe), "--target-loss", "1", "--max-seeds",
                                                                  "2"])
    assert "no candidate runs on 4 workers" in refused(capsys, [str(probe), "--target-loss", "1", "--schemes",
                                                                "gc-fr", "--s", "2"])


def test_a_torch_probe_from_the_simulated_backend(capsys, tmp_path):
    """pgc-bench's sim backend writes a run folder of logreg on digits: advised to a target
    accuracy (test accuracy), the master's cost none (a simulated probe's master took none)."""
    from pgc_mpi.sim.backend import run_simulated

    out = tmp_path / "digits"
    out.mkdir()
    run_simulated({"scheme": "dgd", "steps": 45, "compute_time": 0.02, "delay": "exp:0.05", "eval_every": 15},
                  4, out)
    assert main([str(out), "--target-accuracy", "0.85", "--schemes", "dgd,pgc-cr", "--s", "1", "--seeds", "2",
                 "--max-steps", "120", "--eval-every", "10", "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert advice["probe"]["program"] == "unknown" and advice["master_cost"] is None
    assert advice["target"] == {"kind": "accuracy", "value": 0.85}
    assert all(r["final_accuracy"] >= 0.85 for r in advice["candidates"] if r["reached"] == r["seeds"])
    assert Target("accuracy", 0.85).key({"test_accuracy": 0.9, "train_accuracy": 0.8}) == "test_accuracy"
