"""Configuration in-process: pgc-train's flags, TOML files and errors, SimConfig, the shared core
and its parsers, and that configuring imports neither torch nor mpi4py.

Every configuration error that rank 0 of pgc-train reports is checked here without mpiexec; the
end-to-end "one clear line from rank 0, non-zero exit" cases are in test_train_mpiexec.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pgc_mpi.config import (
    CORE_FIELDS,
    CoreConfig,
    SimConfig,
    TrainConfig,
    build_parser,
    config_from_args,
)
from pgc_mpi.core.stragglers import USAGE
from pgc_mpi.errors import ConfigError
from pgc_mpi.sim.cli import build_parser as build_sim_parser
from pgc_mpi.sim.cli import configs_from_args
from pgc_mpi.sim.cli import main as sim_main

WORKERS = 4  # as under mpiexec -n 5


def _imported_in_a_fresh_interpreter(code: str) -> list[str]:
    """Which of torch, mpi4py, h5py and matplotlib a new interpreter has loaded after `code`."""
    probe = textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        print(json.dumps([m for m in ("torch", "mpi4py", "h5py", "matplotlib") if m in sys.modules]))
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["pgc_mpi.config", "pgc_mpi.sim.cli", "pgc_mpi.commands.bench"])
def test_configuration_modules_import_neither_torch_nor_mpi4py(module):
    loaded = _imported_in_a_fresh_interpreter(f"import {module}")
    assert "torch" not in loaded and "mpi4py" not in loaded, loaded


def test_config_errors_and_bench_listings_do_not_import_torch(tmp_path):
    """pgc-sim's configuration errors and pgc-bench --dry-run/--count stay light too."""
    exp = tmp_path / "exp.toml"
    exp.write_text('name = "t"\nworkers = 3\nschemes = ["dgd", "pgc-cr"]\n[train]\nsteps = 5\n')
    loaded = _imported_in_a_fresh_interpreter(f"""
        from pgc_mpi.commands.bench import main as bench
        from pgc_mpi.sim.cli import main as sim
        assert sim(["-s", "20"]) == 2 and sim(["--on-deadline", "panic"]) == 2
        assert bench([{str(exp)!r}, "--dry-run"]) == 0 and bench([{str(exp)!r}, "--count"]) == 0
    """)
    assert "torch" not in loaded and "mpi4py" not in loaded, loaded


# --- one core, one set of defaults -------------------------------------------------------------

def test_train_and_sim_configs_share_the_core_fields_and_defaults():
    core, train, sim = CoreConfig(), TrainConfig(), SimConfig()
    for name in CORE_FIELDS:
        assert getattr(train, name) == getattr(core, name) == getattr(sim, name), name
    assert (core.scheme, core.stragglers, core.steps, core.lr, core.momentum, core.delay) == \
        ("pgc-cr", 1, 200, 0.5, 0.9, "none")
    assert (sim.workers, sim.compute_time, sim.target_gap) == (12, 1.0, None)
    assert list(CORE_FIELDS) == [f.name for f in dataclasses.fields(TrainConfig)][:len(CORE_FIELDS)]


def test_the_parsers_use_the_same_defaults():
    train = build_parser().parse_args([])
    assert all(getattr(train, name) is None for name in CORE_FIELDS)  # unset: the TOML file may fill it
    assert config_from_args([]) == TrainConfig()
    sim = build_sim_parser().parse_args([])
    for name in CORE_FIELDS:
        if name not in ("scheme", "delay"):
            assert getattr(sim, name) == getattr(CoreConfig(), name), name
    assert sim.delay == "exp:1.0" and sim.steps == 200 and sim.workers == 12 and sim.lr == 0.5


def _option_helps(parser) -> dict[str, str]:
    """Each option's help as --help prints it (with %(default)s filled in), by its long flag."""
    formatter = parser._get_formatter()
    return {a.option_strings[-1]: formatter._expand_help(a) for a in parser._actions
            if a.option_strings and a.dest != "help"}


def test_the_shared_options_are_spelled_and_explained_alike():
    train, sim = _option_helps(build_parser()), _option_helps(build_sim_parser())
    shared = ["--stragglers", "--c", "--steps", "--lr", "--optimizer", "--momentum", "--delay", "--deadline",
              "--on-deadline", "--max-staleness", "--seed"]
    for flag in shared:
        text_train, text_sim = (h.rsplit(" (default:", 1)[0] for h in (train[flag], sim[flag]))
        assert text_train == text_sim, flag
    short = {a.dest: a.option_strings for p in (build_parser(), build_sim_parser()) for a in p._actions}
    assert short["stragglers"] == ["-s", "--stragglers"]
    assert USAGE in train["--delay"] and USAGE in sim["--delay"]


@pytest.mark.parametrize("parser", [build_parser, build_sim_parser], ids=["pgc-train", "pgc-sim"])
def test_every_option_shows_exactly_one_default(parser, capsys):
    for flag, text in _option_helps(parser()).items():
        assert text.count("default") == 1 and "(default: " in text, (flag, text)
        assert "default: None" not in text, (flag, text)
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--on-deadline" in out and "(default: no deadline)" in out


# --- pgc-train: flags, TOML, errors ------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--scheme", "nope"], "unknown scheme 'nope'"),
    (["--lr", "-1"], "--lr must be a number > 0"),
    (["--lr", "nan"], "--lr must be a number > 0"),
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--scheme", "pgc-fr", "-s", "2"], "needs n divisible by c = 3"),
    (["--scheme", "pgc-fr", "-s", "2"], "(with 4 workers = MPI world size 5 - 1)"),
    (["-s", "4"], "s must be smaller than n"),
    (["-s", "-1"], "--stragglers must be an integer >= 0"),
    (["--delay", "hang:9@1"], "worker id 9 is outside 0..3"),
    (["--delay", "slow"], "is not a straggler model"),
    (["--optimizer", "lbfgs"], "--optimizer 'lbfgs' is not one of"),
    (["--momentum", "1"], "--momentum must be in [0, 1)"),
    (["--deadline", "-1"], "--deadline must be a number > 0"),
    (["--on-deadline", "panic"], "--on-deadline 'panic' is not one of"),
    (["--max-staleness", "-1"], "--max-staleness must be window, none or a number of steps >= 0"),
    (["--seed", "-1"], "--seed must be an integer >= 0"),
    (["--scheme", "is-gc-fr", "--c", "3"], "needs n divisible by c = 3"),
    (["--c", "2"], "c applies only to is-gc-fr, is-gc-cr and pbs"),
    (["--batch-size", "0"], "--batch-size must be a positive integer"),
    (["--model", "gpt"], "--model 'gpt' is neither a built-in model (logreg"),
    (["--dtype", "float16"], "--dtype 'float16' is not one of: float32, float64"),
    (["--target-loss", "inf"], "--target-loss must be a finite number"),
    (["--checkpoint-every", "0"], "--checkpoint-every must be a positive integer"),
    (["--resume", "latest"], "--resume latest needs --out"),
    (["--fault", "boom:1@2"], "--fault 'boom:1@2'"),
    (["--fault", "nan:7@2"], "worker id 7 is outside 0..3"),
    (["--problem", "quadratic", "--model", "mlp"],
     "--problem quadratic (a synthetic problem) and --model mlp (a torch model on a data set) exclude each other"),
    (["--dataset", "digits", "--problem", "logistic"], "--problem logistic (a synthetic problem) and --dataset digits"),
    (["--problem", "cubic"], "--problem 'cubic' is not one of: least-squares, logistic, quadratic"),
    (["--dim", "1000"], "--dim 1000 applies only to a synthetic problem: give --problem"),
    (["--problem", "quadratic", "--dim", "0"], "--dim must be a positive integer"),
    (["--problem", "quadratic", "--scheme", "ddp"], "--scheme ddp trains a torch model"),
    (["--problem", "least-squares", "--dim", "100000"], "use --problem quadratic (no data matrix) for large --dim"),
    (["--loader-workers", "many"], "--loader-workers must be a whole number >= 0 (0: each worker reads its own "
                                   "minibatches) or auto, got 'many'"),
    (["--prefetch", "-1"], "--prefetch must be a whole number >= 0"),
])
def test_bad_flags_give_one_clear_error(args, message):
    cfg = config_from_args(args)
    with pytest.raises(ConfigError) as exc:
        cfg.validate(WORKERS)
    assert message in str(exc.value)


@pytest.mark.parametrize("workers", [0, -1])
def test_too_few_ranks(workers):
    with pytest.raises(ConfigError, match="needs at least 2 MPI ranks"):
        TrainConfig().validate(workers)


def test_defaults_are_valid():
    TrainConfig().validate(WORKERS)
    TrainConfig(stragglers=0).validate(1)


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
    (["--lr"], "argument --lr: expected one argument"),
])
def test_flags_argparse_rejects(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        config_from_args(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error") == 1 and "pgc-train: error:" in err


def test_toml_then_flags(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('scheme = "gc-cr"\nsteps = 7\nlr = 0.2\neval-every = 100\nmax_staleness = 2\n')
    cfg = config_from_args(["--config", str(path), "--steps", "5"])
    assert (cfg.scheme, cfg.steps, cfg.lr, cfg.eval_every, cfg.max_staleness) == ("gc-cr", 5, 0.2, 100, 2)
    assert cfg.batch_size == TrainConfig().batch_size == 32  # untouched: the built-in default
    cfg.validate(WORKERS)


@pytest.mark.parametrize("text,message", [
    ('schem = "pgc-cr"\n', "unknown key 'schem'"),
    ('steps = "ten"\n', "config key 'steps' must be of type int"),
    ("steps = 1.5\n", "config key 'steps' must be of type int"),
    ('eval-train = "yes"\n', "config key 'eval-train' must be of type bool"),
    ("steps = \n", "not valid TOML"),
])
def test_bad_toml_key_and_type(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        config_from_args(["--config", str(path)])


def test_missing_toml_file():
    with pytest.raises(ConfigError, match="--config /nonexistent.toml: no such file"):
        config_from_args(["--config", "/nonexistent.toml"])


# --- what rank 0 checks after the flags: data files, models, checkpoints ----------------------

@pytest.fixture(scope="module")
def flat_h5(tmp_path_factory) -> Path:
    from data_prep.__main__ import main as prep

    path = tmp_path_factory.mktemp("data") / "flat.h5"
    assert prep(["synthetic", "--samples", "100", "--features", "3", "--out", str(path)]) == 0
    return path


def test_missing_data_file():
    from pgc_mpi.learning.datasets import open_dataset

    cfg = config_from_args(["--dataset", "/nonexistent.h5"])
    cfg.validate(WORKERS)  # only opening it tells
    with pytest.raises(ConfigError, match="--dataset /nonexistent.h5: no such data file"):
        open_dataset(cfg.dataset, cfg.seed)


def test_truncated_data_file(tmp_path, flat_h5):
    from pgc_mpi.learning.datasets import open_dataset

    broken = tmp_path / "broken.h5"
    broken.write_bytes(flat_h5.read_bytes()[:2000])
    with pytest.raises(ConfigError, match="not a readable HDF5 file"):
        open_dataset(str(broken))


def test_image_model_on_flat_samples(flat_h5):
    from pgc_mpi.learning.datasets import open_dataset
    from pgc_mpi.learning.torch_problem import TorchProblem

    cfg = config_from_args(["--dataset", str(flat_h5), "--model", "cnn"])
    cfg.validate(WORKERS)
    with pytest.raises(ConfigError, match="model 'cnn' needs image samples"):
        TorchProblem(cfg.model, open_dataset(cfg.dataset), WORKERS, cfg.batch_size, partitions=[])


def test_missing_checkpoint(tmp_path):
    from pgc_mpi.errors import PgcError
    from pgc_mpi.runs import checkpoint

    cfg = config_from_args(["--resume", "/nonexistent.h5"])
    cfg.validate(WORKERS)
    with pytest.raises(PgcError, match="--resume /nonexistent.h5: no such checkpoint file"):
        checkpoint.resolve(cfg.resume, tmp_path / "checkpoints")


# --- SimConfig and pgc-sim ---------------------------------------------------------------------

@pytest.mark.parametrize("change,message", [
    ({"steps": 0}, "--steps must be a positive integer"),
    ({"compute_time": 0.0}, "--compute-time must be a number > 0"),
    ({"compute_time": math.inf}, "--compute-time must be a number > 0"),
    ({"deadline": 0.0}, "--deadline must be a number > 0"),
    ({"deadline": math.nan}, "--deadline must be a number > 0"),
    ({"on_deadline": "panic"}, "--on-deadline 'panic' is not one of: wait, partial, fail"),
    ({"workers": 0}, "--workers must be a positive integer, got 0"),
    ({"stragglers": 12}, "s must be smaller than n"),
    ({"stragglers": 12}, "(with 12 workers)"),
    ({"scheme": "nope"}, "unknown scheme 'nope'"),
    ({"lr": 0.0}, "--lr must be a number > 0"),
    ({"optimizer": "lbfgs"}, "--optimizer 'lbfgs' is not one of"),
    ({"momentum": -0.1}, "--momentum must be in [0, 1)"),
    ({"max_staleness": -1}, "--max-staleness must be window, none or a number of steps >= 0"),
    ({"delay": "slow"}, "is not a straggler model"),
    ({"delay": "hang:12@1"}, "worker id 12 is outside 0..11"),
    ({"c": 2}, "c applies only to is-gc-fr, is-gc-cr and pbs"),
    ({"target_gap": -1.0}, "--target-gap must be a finite number >= 0"),
])
def test_sim_config_is_validated_on_construction(change, message):
    with pytest.raises(ConfigError) as exc:
        SimConfig(**change)
    assert message in str(exc.value)


def test_sim_config_is_frozen_and_keeps_its_values():
    cfg = SimConfig(scheme="is-gc-cr", workers=8, stragglers=2, c=3, steps=10, momentum=0.5, max_staleness=2,
                    delay="exp:0.5", compute_time=0.5, target_gap=1e-4, seed=7)
    assert (cfg.workers, cfg.stragglers, cfg.c, cfg.max_staleness, cfg.target_gap) == (8, 2, 3, 2, 1e-4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.steps = 5  # type: ignore[misc]
    assert dataclasses.replace(cfg, seed=8).seed == 8
    with pytest.raises(ConfigError):
        dataclasses.replace(cfg, steps=0)  # replace() validates again


@pytest.mark.parametrize(("deadline", "policy"), [(0.0, "wait"), (1.0, "panic")])
def test_train_and_sim_refuse_a_bad_deadline_alike(deadline, policy):
    with pytest.raises(ConfigError) as sim_error:
        SimConfig(deadline=deadline, on_deadline=policy)
    with pytest.raises(ConfigError) as train_error:
        TrainConfig(deadline=deadline, on_deadline=policy).validate(WORKERS)
    assert str(sim_error.value) == str(train_error.value)


def test_pgc_sim_flags_build_sim_configs():
    args = build_sim_parser().parse_args(["--schemes", "pgc-cr,is-gc-fr", "-n", "8", "-s", "1", "--c", "4",
                                          "--steps", "9", "--lr", "0.3", "--optimizer", "momentum",
                                          "--momentum", "0.5", "--max-staleness", "2", "--deadline", "3",
                                          "--on-deadline", "partial", "--compute-time", "0.5", "--seed", "4",
                                          "--target-gap", "0.01", "--stop-at-target"])
    configs = configs_from_args(args)
    assert list(configs) == ["pgc-cr", "is-gc-fr"]
    assert configs["pgc-cr"].c is None and configs["is-gc-fr"].c == 4  # --c is for the is-gc-* schemes only
    cfg = configs["pgc-cr"]
    assert (cfg.workers, cfg.stragglers, cfg.steps, cfg.lr, cfg.optimizer, cfg.momentum, cfg.max_staleness) == \
        (8, 1, 9, 0.3, "momentum", 0.5, 2)
    assert (cfg.deadline, cfg.on_deadline, cfg.compute_time, cfg.seed, cfg.target_gap, cfg.delay) == \
        (3.0, "partial", 0.5, 4, 0.01, "exp:1.0")
    assert configs_from_args(build_sim_parser().parse_args([]))["dgd"].target_gap is None


@pytest.mark.parametrize("args,message", [
    (["-s", "20"], "s must be smaller than n"),
    (["--on-deadline", "panic"], "--on-deadline 'panic' is not one of"),
    (["--schemes", "dgd,nope"], "unknown scheme(s) ['nope']"),
    (["--compute-time", "0"], "--compute-time must be a number > 0"),
    (["-n", "0"], "--workers must be a positive integer"),
    (["--target-gap", "-1"], "--target-gap must be a finite number >= 0"),
])
def test_pgc_sim_reports_a_bad_configuration_in_one_line(args, message, capsys):
    assert sim_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("pgc-sim: error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("change, message", [
    ({"scheme": "pgc-cr", "adapt": True}, "--adapt applies only to pbs"),
    ({"scheme": "pgc-cr", "replication": 2}, "replication applies only to pbs"),
    ({"scheme": "pgc-cr", "on_stale": "drop"}, "--on-stale 'drop' is not one of: refresh, reject"),
    ({"scheme": "pgc-cr", "max_staleness": "forever"}, "--max-staleness must be window, none or a number"),
    ({"scheme": "pgc-cr", "max_staleness": True}, "--max-staleness must be window, none or a number"),
])
def test_the_pipeline_options_are_checked(change, message):
    with pytest.raises(ConfigError, match=message):
        SimConfig(**change)


def test_max_staleness_words_and_numbers_from_flags_and_toml(tmp_path):
    cfg = SimConfig(scheme="pgc-cr", workers=6, stragglers=2)
    scheme = cfg.make_scheme(6)
    assert cfg.staleness_bound(scheme) == 2 and cfg.refresh_over(scheme) == 2
    assert SimConfig(scheme="pgc-cr", max_staleness="none").staleness_bound(scheme) is None
    assert SimConfig(scheme="pgc-cr", max_staleness="5", on_stale="reject").refresh_over(scheme) is None
    assert SimConfig(scheme="gc-cr").staleness_bound(SimConfig(scheme="gc-cr").make_scheme(12)) == 0
    toml = tmp_path / "run.toml"
    toml.write_text('max-staleness = "none"\non-stale = "reject"\nreplication = 3\nscheme = "pbs"\nadapt = true\n')
    assert config_from_args(["--config", str(toml)]).max_staleness == "none"
    toml.write_text("max-staleness = 4\n")
    assert config_from_args(["--config", str(toml)]).max_staleness == 4
    assert config_from_args(["--max-staleness", "3"]).max_staleness == 3
    assert config_from_args(["--max-staleness", "none"]).max_staleness == "none"
    pbs = SimConfig(scheme="pbs", workers=6, replication=3, c=5)
    assert pbs.scheme_shape(pbs.make_scheme(6)) == {"c": 3, "max_staleness_steps": 4, "on_stale": "refresh",
                                                     "staleness_correction": "none", "replication": 3, "window": 5}
