"""Checkpoints in-process: round trip of the optimizer state, atomic files, pruning, clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.learning.optim import FlatOptimizer
from pgc_mpi.runs import checkpoint
from pgc_mpi.runs.metrics import MetricsWriter, read_metrics

IDENTITY = {"scheme": "pgc-cr", "n": 4, "s": 1, "c": 2, "dim": 5, "dtype": "float64", "model": "logreg",
            "dataset": "digits"}


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
def test_optimizer_state_round_trips_and_continues_identically(tmp_path, name):
    w = np.linspace(0, 1, 5)
    opt = FlatOptimizer(w, name, 0.1)
    for k in range(3):
        opt.grad[:] = np.sin(w + k)
        opt.step()
    path = checkpoint.save(tmp_path, 3, w, opt.opt.state_dict(), IDENTITY, {"lr": 0.1})
    ck = checkpoint.load(path, IDENTITY)
    w2 = ck.params.copy()
    opt2 = FlatOptimizer(w2, name, 0.1)
    opt2.opt.load_state_dict(ck.optimizer)
    for k in range(3, 6):
        for o, x in ((opt, w), (opt2, w2)):
            o.grad[:] = np.sin(x + k)
            o.step()
    np.testing.assert_array_equal(w, w2)
    assert ck.step == 3


def test_only_the_newest_are_kept_and_no_temporary_files_remain(tmp_path):
    w = np.zeros(5)
    opt = FlatOptimizer(w)
    for step in (2, 4, 6, 8):
        checkpoint.save(tmp_path, step, w, opt.opt.state_dict(), IDENTITY, {}, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt-00000006.h5", "ckpt-00000008.h5"]
    assert checkpoint.resolve("latest", tmp_path).name == "ckpt-00000008.h5"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_pbs_table_and_encoding_are_stored(tmp_path):
    sch = make_scheme("pbs", 4, 1)
    table = sch.new_table(5)
    table.offer(2, 7, np.ones(5))
    w = np.zeros(5)
    path = checkpoint.save(tmp_path, 9, w, FlatOptimizer(w).opt.state_dict(), IDENTITY, {}, table=table)
    ck = checkpoint.load(path, IDENTITY)
    assert ck.table_versions[2] == 7 and ck.table_grads[2].sum() == 5
    B = make_scheme("gc-cr", 4, 1, seed=1).encoding_matrix()
    path = checkpoint.save(tmp_path, 10, w, FlatOptimizer(w).opt.state_dict(), IDENTITY, {}, encoding=B)
    checkpoint.load(path, IDENTITY, encoding=B)
    with pytest.raises(checkpoint.CheckpointError, match="encoding matrix differs"):
        checkpoint.load(path, IDENTITY, encoding=make_scheme("gc-cr", 4, 1, seed=2).encoding_matrix())


def test_mismatch_and_corruption_are_clear_errors(tmp_path):
    w = np.zeros(5)
    path = checkpoint.save(tmp_path, 3, w, FlatOptimizer(w).opt.state_dict(), IDENTITY, {})
    with pytest.raises(checkpoint.CheckpointError, match="for s = 1, this run has 2"):
        checkpoint.load(path, {**IDENTITY, "s": 2})
    elastic = checkpoint.load(path, {**IDENTITY, "n": 8})  # another n: an elastic restart, said so
    assert elastic.workers_before == 4 and elastic.step == 3 and elastic.table_grads is None
    assert checkpoint.load(path, IDENTITY).workers_before is None
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint in"):
        checkpoint.resolve("latest", tmp_path / "empty")
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(checkpoint.CheckpointError, match="not a readable checkpoint"):
        checkpoint.load(path, IDENTITY)


def test_metrics_resume_keeps_only_earlier_steps(tmp_path):
    m = MetricsWriter(tmp_path)
    for step in range(6):
        m.write({"step": step})
        if step % 2:
            m.write({"event": "eval", "step": step})
    m.write({"event": "summary", "steps": 6})
    m.close()
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 6, "trunc')  # a line cut short by a crash
    m = MetricsWriter(tmp_path, keep_steps_before=4)
    m.write({"step": 4})
    m.close()
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs if "event" not in r] == [0, 1, 2, 3, 4]
    assert [r["step"] for r in recs if r.get("event") == "eval"] == [1, 3]
    assert not any(r.get("event") == "summary" for r in recs)
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert first == {"step": 0, "time": recs[0]["time"]}  # kept as written, its time included
    assert torch.get_rng_state().numel() > 0


# A model's state (layout and buffers), blobs, named checkpoints, and the state_dict rebuilt from a file.
LAYOUT = [{"name": "lin.weight", "kind": "param", "shape": [2, 2], "dtype": "float64", "offset": 0},
          {"name": "lin.bias", "kind": "param", "shape": [1], "dtype": "float64", "offset": 4},
          {"name": "bn.running_mean", "kind": "buffer", "shape": [2], "dtype": "float64"},
          {"name": "bn.num_batches_tracked", "kind": "buffer", "shape": [], "dtype": "int64"},
          {"name": "odd/name", "kind": "buffer", "shape": [1], "dtype": "bool"}]
BUFFERS = {"bn.running_mean": np.array([0.5, -1.0]), "bn.num_batches_tracked": np.array(7),
           "odd/name": np.array([True])}


def _save(tmp_path, step=3, **kw):
    w = np.arange(5, dtype=np.float64)
    return checkpoint.save(tmp_path, step, w, FlatOptimizer(w).opt.state_dict(), IDENTITY, {}, **kw)


def test_model_state_and_blobs_round_trip(tmp_path):
    blobs = {"optimizer": bytes(range(256)), "empty": b"", "a/b": b"xyz"}
    ck = checkpoint.load(_save(tmp_path, model_state=(LAYOUT, BUFFERS), blobs=blobs), IDENTITY)
    layout, buffers = ck.model_state
    assert layout == LAYOUT and list(buffers) == list(BUFFERS)
    for name, value in BUFFERS.items():
        assert buffers[name].dtype == value.dtype and np.array_equal(buffers[name], value)
    assert ck.blobs == blobs
    plain = checkpoint.load(_save(tmp_path, step=4), IDENTITY)  # neither: None and {}
    assert plain.model_state is None and plain.blobs == {}


def test_a_damaged_model_state_is_one_line(tmp_path):
    import h5py

    path = _save(tmp_path, model_state=(LAYOUT, BUFFERS))
    with h5py.File(path, "r+") as f:
        del f["buffers/bn.running_mean"]
    with pytest.raises(checkpoint.CheckpointError, match="missing buffer 'bn.running_mean'") as exc:
        checkpoint.load(path, IDENTITY)
    assert "\n" not in str(exc.value)
    for bad in ("not json", json.dumps([{"name": "x"}]),
                json.dumps([{**LAYOUT[0], "shape": [3, 2]}, *LAYOUT[1:]])):  # does not tile the 5 parameters
        path = _save(tmp_path, model_state=(LAYOUT, BUFFERS))
        with h5py.File(path, "r+") as f:
            f.attrs["state_layout"] = bad
        for read in (lambda p: checkpoint.load(p, IDENTITY), checkpoint.read_state_dict):
            with pytest.raises(checkpoint.CheckpointError, match="model layout") as exc:
                read(path)
            assert "\n" not in str(exc.value)
    with h5py.File(path, "r+") as f:
        f.create_dataset("blobs/x", data=np.zeros(3))
        f.attrs["state_layout"] = json.dumps(LAYOUT)
    with pytest.raises(checkpoint.CheckpointError, match="blob 'x' is not a byte string"):
        checkpoint.load(path, IDENTITY)


def test_named_checkpoints_are_neither_steps_nor_pruned(tmp_path):
    best = _save(tmp_path, step=2, name="best")
    assert best.name == "best.h5"
    for step in (2, 4, 6, 8):
        _save(tmp_path, step=step, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt-00000006.h5", "ckpt-00000008.h5"]
    assert best.is_file() and checkpoint.load(best, IDENTITY).step == 2
    assert checkpoint.resolve("latest", tmp_path).name == "ckpt-00000008.h5"
    _save(tmp_path, step=9, name="best")  # replaced in place, prunes nothing
    assert checkpoint.load(best, IDENTITY).step == 9 and len(checkpoint.list_checkpoints(tmp_path)) == 2
    ckpt = checkpoint.Checkpointer(tmp_path, IDENTITY, {}, keep=1)
    w = np.zeros(5)
    assert ckpt.save(10, w, FlatOptimizer(w).opt.state_dict(), name="final").name == "final.h5"
    for bad in ("ckpt-00000001", "x-ckpt-00000001", "../best", "", ".hidden"):
        with pytest.raises(ValueError, match="checkpoint name"):
            _save(tmp_path, name=bad)


def test_read_state_dict_rebuilds_the_model_state(tmp_path):
    state = checkpoint.read_state_dict(_save(tmp_path, model_state=(LAYOUT, BUFFERS)))
    assert list(state) == [e["name"] for e in LAYOUT]
    assert torch.equal(state["lin.weight"], torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float64))
    assert torch.equal(state["lin.bias"], torch.tensor([4.0], dtype=torch.float64))
    assert state["bn.num_batches_tracked"].dtype == torch.int64 and int(state["bn.num_batches_tracked"]) == 7
    assert state["odd/name"].dtype == torch.bool and torch.equal(state["bn.running_mean"],
                                                                  torch.tensor([0.5, -1.0], dtype=torch.float64))
    with pytest.raises(checkpoint.CheckpointError, match="holds no model layout") as exc:
        checkpoint.read_state_dict(_save(tmp_path, step=4))
    assert "\n" not in str(exc.value)
    broken = tmp_path / "broken.h5"
    broken.write_bytes(b"not hdf5")
    with pytest.raises(checkpoint.CheckpointError, match="not a readable checkpoint"):
        checkpoint.read_state_dict(broken)


def test_a_tied_parameter_is_one_tensor_under_each_name(tmp_path):
    tied = [{"name": "enc.weight", "kind": "param", "shape": [5], "dtype": "float64", "offset": 0},
            {"name": "dec.weight", "kind": "param", "shape": [5], "dtype": "float64", "offset": 0}]
    state = checkpoint.read_state_dict(_save(tmp_path, model_state=(tied, {})))
    assert state["enc.weight"] is state["dec.weight"] and state["dec.weight"].tolist() == [0, 1, 2, 3, 4]
