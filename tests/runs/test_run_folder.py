"""The run folder's rules without MPI: refusal, --overwrite, --resume auto, config matching, names."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pgc_mpi.config import TrainConfig
from pgc_mpi.errors import ConfigError
from pgc_mpi.runs import run_folder


def _write_run(out: Path, cfg: TrainConfig, workers: int = 3, checkpoints: tuple[int, ...] = ()) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"config": cfg.to_dict(), "workers": workers}))
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    for step in checkpoints:
        (out / "checkpoints").mkdir(exist_ok=True)
        (out / "checkpoints" / run_folder.checkpoint_name(step)).write_bytes(b"x")


def test_a_folder_holding_a_run_is_refused_with_both_ways_out(tmp_path):
    cfg = TrainConfig(out=str(tmp_path))
    assert run_folder.plan(cfg, 3).out == str(tmp_path)  # empty: fine
    (tmp_path / "slurm-12.out").write_text("a batch log")  # other files do not make a run
    assert run_folder.plan(cfg, 3).out == str(tmp_path)
    _write_run(tmp_path, cfg)
    with pytest.raises(ConfigError, match=r"already holds a run \(config.json, metrics.jsonl\); continue it with "
                                          r"--resume auto, delete its outputs with --overwrite"):
        run_folder.plan(cfg, 3)
    assert run_folder.plan(TrainConfig(out=str(tmp_path), overwrite=True), 3).overwrite
    (tmp_path / "x").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        run_folder.plan(TrainConfig(out=str(tmp_path / "x")), 3)


def test_overwrite_clears_only_the_runs_outputs(tmp_path):
    cfg = TrainConfig(out=str(tmp_path))
    _write_run(tmp_path, cfg, checkpoints=(10, 20))
    (tmp_path / "params.npy").write_bytes(b"p")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".overwritten-dead").mkdir()  # left by a crash in an earlier clear
    run_folder.clear(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert not run_folder.holds_run(tmp_path)


def test_resume_auto_resolves_to_the_checkpoint_or_a_fresh_start(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "new"), resume="auto")
    assert run_folder.plan(cfg, 3).resume is None  # nothing there yet: start afresh
    killed_early = tmp_path / "early"
    _write_run(killed_early, TrainConfig(out=str(killed_early)))
    planned = run_folder.plan(TrainConfig(out=str(killed_early), resume="auto"), 3)
    assert planned.resume is None and planned.overwrite  # same run, no checkpoint: started again from step 0
    with (killed_early / "metrics.jsonl").open("a") as fh:  # it completed: starting again would delete it
        fh.write('{"event": "summary", "status": "completed"}\n')
    with pytest.raises(ConfigError, match="holds a completed run and no checkpoint to continue it from; use "
                                          "--overwrite"):
        run_folder.plan(TrainConfig(out=str(killed_early), resume="auto"), 3)
    later = tmp_path / "later"
    _write_run(later, TrainConfig(out=str(later)), checkpoints=(10,))
    assert run_folder.plan(TrainConfig(out=str(later), resume="auto", steps=500), 3).resume == "latest"


def test_resuming_another_run_names_the_differing_options(tmp_path):
    _write_run(tmp_path, TrainConfig(out=str(tmp_path), scheme="pgc-cr", seed=1), checkpoints=(10,))
    with pytest.raises(ConfigError) as err:
        run_folder.plan(TrainConfig(out=str(tmp_path), scheme="gc-cr", seed=2, resume="auto", steps=900), 3)
    text = str(err.value)
    assert "describes another run: scheme 'pgc-cr' (this run: 'gc-cr'); seed 1 (this run: 2)" in text
    assert "steps" not in text  # more steps is how a run is extended: not a difference
    # another number of workers is not another run: an elastic restart (checkpoint.load rebuilds the placement)
    assert run_folder.plan(TrainConfig(out=str(tmp_path), scheme="pgc-cr", seed=1, resume="latest"), 5).resume == \
        "latest"
    (tmp_path / "config.json").unlink()
    with pytest.raises(ConfigError, match="no config.json to check them against; use --overwrite"):
        run_folder.plan(TrainConfig(out=str(tmp_path), resume="auto"), 3)


def test_the_staleness_correction_is_compared_as_the_scheme_applies_it(tmp_path):
    """A run from before --staleness-correction (no such key) used the paper's estimator; a scheme
    without stale buffers ignores it, so its resume never trips over it."""
    for scheme in ("pgc-fr", "dgd"):
        old = TrainConfig(out=str(tmp_path), scheme=scheme).to_dict()
        del old["staleness_correction"]
        recorded = {"config": old, "workers": 4}
        same = TrainConfig(out=str(tmp_path), scheme=scheme, staleness_correction="none")
        other = TrainConfig(out=str(tmp_path), scheme=scheme, staleness_correction="weights:0.3")
        assert run_folder.differences(same, 4, recorded) == []
        expected = ["staleness_correction 'none' (this run: 'weights:0.3')"] if scheme == "pgc-fr" else []
        assert run_folder.differences(other, 4, recorded) == expected


def _with_data(train: str | None, test: str | None = None):
    """A stand-in problem whose data source has the given fingerprints."""
    fingerprint = {"train": train, "test": test}
    return SimpleNamespace(source=SimpleNamespace(fingerprint=lambda: fingerprint))


def test_a_resume_on_other_data_is_refused_unless_accepted(tmp_path):
    cfg = TrainConfig(out=str(tmp_path), resume="latest")
    _write_run(tmp_path, cfg, checkpoints=(10,))
    run_folder.check_same_data(cfg, _with_data("blake2b:aa"))  # a folder from before fingerprints: unknown, resumed
    recorded = json.loads((tmp_path / "config.json").read_text())
    recorded["data_fingerprint"] = {"train": "blake2b:aa", "test": None}
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    run_folder.check_same_data(cfg, _with_data("blake2b:aa"))
    run_folder.check_same_data(cfg, None)  # no data to fingerprint (an HDF5 file, a synthetic problem)
    with pytest.raises(ConfigError, match=r"--resume latest: this run's training data differ from those of the run in "
                                          r".* \(fingerprint bb, its config.json's aa\): resume on the same data .* "
                                          r"resume_other_data=True \(--resume-other-data\)"):
        run_folder.check_same_data(cfg, _with_data("blake2b:bb"))
    with pytest.raises(ConfigError, match="this run's training and test data differ"):
        run_folder.check_same_data(cfg, _with_data("blake2b:bb", "blake2b:cc"))
    run_folder.check_same_data(TrainConfig(out=str(tmp_path), resume="latest", resume_other_data=True),
                               _with_data("blake2b:bb"))
    run_folder.check_same_data(TrainConfig(out=str(tmp_path)), _with_data("blake2b:bb"))  # no resume: no check
    # the opt-in is no other run's option: accepted whether the folder's run had it or not
    assert run_folder.plan(TrainConfig(out=str(tmp_path), resume="auto", resume_other_data=True), 3).resume == "latest"


def test_data_differences_treat_unknown_as_the_same():
    theirs = {"data_fingerprint": {"train": "a", "test": "b"}}
    assert run_folder.data_differences(theirs, {"train": "a", "test": "b"}) == []
    assert run_folder.data_differences(theirs, {"train": "a", "test": None}) == ["test"]
    assert run_folder.data_differences({"data_fingerprint": None}, {"train": "x", "test": None}) == []
    assert run_folder.data_differences({}, {"train": "x", "test": None}) == []
    assert run_folder.data_differences(None, {"train": "x", "test": None}) == []
    assert run_folder.data_differences(theirs, None) == []


def test_resume_and_overwrite_exclude_each_other():
    with pytest.raises(ConfigError, match="--resume and --overwrite exclude each other"):
        TrainConfig(out="x", resume="auto", overwrite=True).validate(3)


def test_default_names_follow_the_slurm_job_or_never_repeat(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    names = {run_folder.default_out("pgc-cr") for _ in range(50)}
    assert len(names) == 50 and all(p.parent == Path("runs") and p.name.startswith("pgc-cr-") for p in names)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert run_folder.default_out("dgd") == Path("runs/dgd-slurm4242")  # the same after a requeue
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4240")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert run_folder.default_out("dgd") == Path("runs/dgd-slurm4240_2")
    TrainConfig(resume="auto").validate(3)  # under Slurm the default folder is known: no --out needed


def test_a_resume_drops_the_checkpoints_of_the_abandoned_continuation(tmp_path):
    for step in (10, 20, 30):
        (tmp_path / run_folder.checkpoint_name(step)).write_bytes(b"x")
    dropped = run_folder.drop_checkpoints_after(tmp_path, 20)
    assert [p.name for p in dropped] == ["ckpt-00000030.h5"]
    assert [run_folder.checkpoint_step(p) for p in run_folder.list_checkpoints(tmp_path)] == [10, 20]
