"""The same data on every rank, under mpiexec (bounded; 3 ranks, tiny data, few steps): data drawn
without a seed is refused before training with one line naming the ranks, whether a fit script or a
pgc-train --dataset PATH:NAME draws it; config.json records the data's fingerprint; a resume on other
data is refused, and accepted with resume_other_data."""

from __future__ import annotations

import json

import numpy as np

from pgc_mpi.learning.fingerprint import data_fingerprint

from helpers import events_of, run_mpi, run_train

# argv: SEED ('none': unseeded), OUT, then fit's options as JSON
FIT_SCRIPT = '''
import json
import sys

import numpy as np
from torch import nn

import pgc_mpi


def make_model():
    return nn.Linear(4, 2)


seed, out = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(None if seed == "none" else int(seed))
x = rng.standard_normal((48, 4)).astype(np.float32)
y = (x[:, 0] > 0).astype(np.int64)
pgc_mpi.fit(make_model, (x[:36], y[:36]), test_data=(x[36:], y[36:]), scheme="gc-cr", stragglers=1,
            batch_size=6, eval_every=2, out=out, **json.loads(sys.argv[3]))
'''

# pgc-train --dataset PATH:NAME with data drawn without a seed
PLUGIN = '''
import numpy as np


def make():
    rng = np.random.default_rng()
    x = rng.standard_normal((40, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)
'''


def _arrays(seed: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((48, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return (x[:36], y[:36]), (x[36:], y[36:])


def _fit(tmp_path, seed: str, out, **options):
    script = tmp_path / "fit_mine.py"
    script.write_text(FIT_SCRIPT)
    return run_mpi(3, [str(script), seed, str(out), json.dumps({"steps": 4, **options})], timeout=90)


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def test_unseeded_data_is_refused_before_training_naming_the_ranks(tmp_path):
    out = tmp_path / "run"
    proc = _fit(tmp_path, "none", out)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and errors[0].startswith("pgc_mpi.fit: error: ranks 1, 2 of 3 hold other training "
                                                     "data than rank 0 (fingerprint "), proc.stderr[-3000:]
    assert "seed what draws it" in errors[0] and "load the same files on every rank" in errors[0]
    assert "Traceback" not in proc.stderr and not (out / "metrics.jsonl").exists()  # nothing trained


def test_unseeded_data_of_a_pgc_train_plugin_is_refused_too(tmp_path):
    (tmp_path / "mydata.py").write_text(PLUGIN)
    proc = run_train(3, ["--scheme", "gc-cr", "-s", "1", "--steps", "4", "--batch-size", "5",
                         "--dataset", f"{tmp_path / 'mydata.py'}:make", "--out", str(tmp_path / "run")], timeout=90)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and "pgc-train: error: ranks 1, 2 of 3 hold other training data" in errors[0], \
        proc.stderr[-3000:]


def test_seeded_data_trains_records_its_fingerprint_and_resumes_only_on_the_same_data(tmp_path):
    out = tmp_path / "run"
    proc = _fit(tmp_path, "5", out, checkpoint_every=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train, test = _arrays(5)
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["data_fingerprint"] == {"train": data_fingerprint(train), "test": data_fingerprint(test)}
    assert recorded["data_changes"] == []

    proc = _fit(tmp_path, "6", out, steps=6, resume="auto")  # other data, the same options
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and "error: --resume latest: this run's training and test data differ from those of " \
                                "the run in" in errors[0] and "resume_other_data=True" in errors[0], proc.stderr[-3000:]
    assert events_of(out, "summary")[-1]["steps"] == 4  # the run is as it was

    proc = _fit(tmp_path, "6", out, steps=6, resume="auto", resume_other_data=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on other data than the run was trained on" in proc.stderr
    recorded = json.loads((out / "config.json").read_text())
    train6, test6 = _arrays(6)
    assert recorded["data_fingerprint"] == {"train": data_fingerprint(train6), "test": data_fingerprint(test6)}
    assert recorded["data_changes"] == [{"step": 4, "data_fingerprint_before": {"train": data_fingerprint(train),
                                                                                 "test": data_fingerprint(test)}}]
    assert events_of(out, "summary")[-1]["steps"] == 6
