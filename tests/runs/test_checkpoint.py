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
    with pytest.raises(checkpoint.CheckpointError, match="incomplete checkpoint \\(cut short"):
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
    assert first == {"step": 0, "time": recs[0]["time"], "crc32": first["crc32"]}  # kept, its time and CRC included
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
    checkpoint.seal(path)  # each edit sealed: past the digest, to the checks of the layout
    with pytest.raises(checkpoint.CheckpointError, match="missing buffer 'bn.running_mean'") as exc:
        checkpoint.load(path, IDENTITY)
    assert "\n" not in str(exc.value)
    for bad in ("not json", json.dumps([{"name": "x"}]),
                json.dumps([{**LAYOUT[0], "shape": [3, 2]}, *LAYOUT[1:]])):  # does not tile the 5 parameters
        path = _save(tmp_path, model_state=(LAYOUT, BUFFERS))
        with h5py.File(path, "r+") as f:
            f.attrs["state_layout"] = bad
        checkpoint.seal(path)
        for read in (lambda p: checkpoint.load(p, IDENTITY), checkpoint.read_state_dict):
            with pytest.raises(checkpoint.CheckpointError, match="model layout") as exc:
                read(path)
            assert "\n" not in str(exc.value)
    with h5py.File(path, "r+") as f:
        f.create_dataset("blobs/x", data=np.zeros(3))
        f.attrs["state_layout"] = json.dumps(LAYOUT)
    checkpoint.seal(path)
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


# Integrity: the digest in the user block, damage refused in one line, the resume falling back past it.
def _same(a: checkpoint.Checkpoint, b: checkpoint.Checkpoint) -> bool:
    """Whether two loaded checkpoints hold exactly the same numbers (bit for bit, dtypes included)."""
    def equal(x, y):
        x, y = np.asarray(x), np.asarray(y)
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()

    sa, sb = a.optimizer["state"].get(0, {}), b.optimizer["state"].get(0, {})
    return (a.step == b.step and equal(a.params, b.params) and sa.keys() == sb.keys()
            and all(equal(sa[k].numpy(), sb[k].numpy()) for k in sa)
            and a.optimizer["param_groups"] == b.optimizer["param_groups"] and equal(a.rng.numpy(), b.rng.numpy())
            and a.blobs == b.blobs and a.model_state[0] == b.model_state[0]
            and all(equal(a.model_state[1][k], b.model_state[1][k]) for k in b.model_state[1]))


def test_damaged_bytes_never_load_other_numbers(tmp_path):
    """Seeded fuzz: a byte changed at 300 places spread over the file (user block, HDF5 structure,
    attributes, every array), and the file cut at 12 places: each load returns exactly the saved
    numbers or raises CheckpointError in one line; never another exception, never other numbers."""
    import random

    w = np.linspace(-1, 1, 5)
    opt = FlatOptimizer(w, "adam", 0.1)
    opt.grad[:] = 0.25
    opt.step()
    path = checkpoint.save(tmp_path, 7, w, opt.opt.state_dict(), IDENTITY, {"lr": 0.1},
                           model_state=(LAYOUT, BUFFERS), blobs={"x": b"abc"})
    original, reference = path.read_bytes(), checkpoint.load(path, IDENTITY)
    rng = random.Random(45)
    spread = [rng.randrange(k * len(original) // 300, (k + 1) * len(original) // 300) for k in range(300)]
    damaged = tmp_path / "damaged.h5"
    cases = [(f"byte {at}", bytes(original[:at]) + bytes([original[at] ^ rng.randrange(1, 256)])
              + original[at + 1:]) for at in spread]
    cases += [(f"cut at {at}", original[:at]) for at in (0, 1, 8, 100, 511, 512, 513, 520, 1024,
                                                          len(original) // 2, len(original) - 512, len(original) - 1)]
    refused = 0
    for what, data in cases:
        damaged.write_bytes(data)
        try:
            found = checkpoint.load(damaged, IDENTITY)
        except checkpoint.CheckpointError as exc:
            assert "\n" not in str(exc) and str(damaged) in str(exc), what
            refused += 1
            continue
        assert _same(found, reference), f"{what}: loaded other numbers"
    assert refused == len(cases)  # the digest covers every byte after the user block, and the block itself


def test_a_checkpoint_without_a_digest_is_still_accepted(tmp_path):
    """A file written before digests were stored (plain HDF5, no user block) loads as before, with
    the checks of its arrays; and sealing it gives it a digest."""
    path = _save(tmp_path, model_state=(LAYOUT, BUFFERS))
    assert checkpoint.verify(path) is True and path.read_bytes().startswith(b"pgc-mpi checkpoint v1\n")
    old = tmp_path / "old.h5"
    old.write_bytes(path.read_bytes()[checkpoint.USERBLOCK:])  # what an older pgc-mpi wrote
    assert checkpoint.verify(old) is False
    assert _same(checkpoint.load(old, IDENTITY), checkpoint.load(path, IDENTITY))
    assert list(checkpoint.read_state_dict(old)) == [e["name"] for e in LAYOUT]
    assert checkpoint.verify(checkpoint.seal(old)) is True and old.read_bytes() == path.read_bytes()


def test_a_checkpoint_changed_after_it_was_written_is_refused_in_one_line(tmp_path):
    """An edit (h5py "r+"), a flipped bit in params, or what h5py raises on a structure no checkpoint
    has: DamagedCheckpointError, one line naming the file, from load and read_state_dict alike."""
    import h5py

    path = _save(tmp_path, model_state=(LAYOUT, BUFFERS))
    with h5py.File(path, "r+") as f:
        f.attrs["step"] = 4
    for read in (lambda p: checkpoint.load(p, IDENTITY), checkpoint.read_state_dict):
        with pytest.raises(checkpoint.DamagedCheckpointError, match="do not match the digest") as exc:
            read(path)
        assert "\n" not in str(exc.value) and str(path) in str(exc.value)
    with h5py.File(path, "r+") as f:  # params made a committed datatype: h5py raises AttributeError reading it
        del f["params"]
        f["params"] = np.dtype("float64")
    checkpoint.seal(path)
    with pytest.raises(checkpoint.DamagedCheckpointError, match="the checkpoint is damaged \\(AttributeError") as exc:
        checkpoint.load(path, IDENTITY)
    assert "\n" not in str(exc.value)


def _damage(path):
    """Flip one byte in the middle of a checkpoint (inside its HDF5 image)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_resume_latest_falls_back_past_damaged_checkpoints_and_says_so(tmp_path, caplog):
    """--resume latest: the newest intact checkpoint, with a warning naming the damaged ones and the
    one resumed from (whose step the run's outputs are cut at); a path is that file only; a
    checkpoint of another run is an error, never skipped; none intact: one line saying so."""
    import logging

    paths = [_save(tmp_path, step=step, keep=4) for step in (10, 20, 30)]
    _damage(paths[2])
    with caplog.at_level(logging.WARNING, logger="pgc_mpi"):
        resumed = checkpoint.load_resume("latest", tmp_path, IDENTITY)
    assert resumed.step == 20 and resumed.path == paths[1]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert f"{paths[2]}: damaged or incomplete checkpoint" in warned
    assert f"resuming from {paths[1]} (step 20), the newest intact checkpoint, instead of the damaged " \
           f"ckpt-00000030.h5" in warned
    with pytest.raises(checkpoint.DamagedCheckpointError, match="do not match the digest"):  # named: no fallback
        checkpoint.load_resume(str(paths[2]), tmp_path, IDENTITY)
    assert checkpoint.load_resume(str(paths[0]), tmp_path, IDENTITY).step == 10
    paths[1].write_bytes(paths[1].read_bytes()[:1000])  # cut short too: back to step 10
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pgc_mpi"):
        assert checkpoint.load_resume("latest", tmp_path, IDENTITY).step == 10
    assert "instead of the damaged ckpt-00000030.h5, ckpt-00000020.h5; the steps after 10" in caplog.text
    with pytest.raises(checkpoint.CheckpointError, match="for s = 1, this run has 2") as exc:
        checkpoint.load_resume("latest", tmp_path, {**IDENTITY, "s": 2})  # damage skipped, another run is not
    assert not isinstance(exc.value, checkpoint.DamagedCheckpointError)
    _damage(paths[0])
    with pytest.raises(checkpoint.DamagedCheckpointError) as exc:
        checkpoint.load_resume("latest", tmp_path, IDENTITY)
    assert str(exc.value) == (f"--resume latest: every checkpoint in {tmp_path} is damaged (ckpt-00000030.h5, "
                              f"ckpt-00000020.h5, ckpt-00000010.h5), none is left to resume from; start the run "
                              f"afresh (--overwrite) or restore a checkpoint from a copy")


def test_another_run_s_newest_checkpoint_is_not_skipped(tmp_path):
    """Only damage falls back: an intact newest checkpoint of another run shape is the error."""
    _save(tmp_path, step=10)
    w = np.arange(5, dtype=np.float64)
    checkpoint.save(tmp_path, 20, w, FlatOptimizer(w).opt.state_dict(), {**IDENTITY, "s": 2}, {})
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-00000020.h5: the checkpoint is for s = 2, this run "
                                                         "has 1") as exc:
        checkpoint.load_resume("latest", tmp_path, IDENTITY)
    assert not isinstance(exc.value, checkpoint.DamagedCheckpointError)
