"""pgc-export and the model state behind it: a torch problem's state layout and evaluation-time
buffers, checkpointed, exported by the command and loaded into a fresh module; every bad input is
one line and exit status 2. Plain pytest, small in-memory arrays, no MPI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import pgc_mpi
from pgc_mpi.commands.export import main
from pgc_mpi.job.fitting import FitResult
from pgc_mpi.learning.optim import FlatOptimizer
from pgc_mpi.learning.torch_problem import torch_problem
from pgc_mpi.runs import checkpoint


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2),
                         nn.Linear(16, 10))


class Tied(nn.Module):
    """An encoder and a decoder sharing one weight (tied)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(64, 10, bias=False)
        self.norm = nn.BatchNorm1d(10)
        self.dec = nn.Linear(10, 10)
        self.head = nn.Linear(10, 10, bias=False)
        self.head.weight = self.dec.weight

    def forward(self, x):
        return self.head(self.dec(self.norm(self.enc(x.flatten(1)))))


def arrays(n: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, n)


def problem(model=bn_model, **kw):
    return torch_problem(model, arrays(), workers=4, test_data=arrays(60, seed=1), **kw)


def trained(p) -> np.ndarray:
    """Parameters a few steps of SGD away from the initial ones (so that the statistics move)."""
    w = p.initial_params()
    for k in range(5):
        w -= 0.1 * p.grad(w, k % 4, k)
    return w


def run_folder(tmp_path, p, w, steps=(10, 20)):
    """A run folder whose checkpoints hold the model's layout and state."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config": {}}))
    identity = {"dim": p.dim, "dtype": "float32", "model": "bn", "dataset": "arrays"}
    for step in steps:
        checkpoint.save(run / "checkpoints", step, w, FlatOptimizer(w).opt.state_dict(), identity, {},
                        model_state=(p.state_layout(), p.model_state(w)))
    return run


def one_error(capsys) -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("pgc-export: error: "), err
    return err[0]


def test_the_layout_lists_the_state_dict_with_parameters_at_their_offsets():
    p = problem()
    layout = p.state_layout()
    assert [e["name"] for e in layout] == list(p.module.state_dict())
    params = [e for e in layout if e["kind"] == "param"]
    assert [e["offset"] for e in params] == [0, 1024, 1040, 1056, 1072, 1232]
    assert {e["name"]: e["dtype"] for e in layout if e["kind"] == "buffer"} == {
        "2.running_mean": "float32", "2.running_var": "float32", "2.num_batches_tracked": "int64"}
    plain = torch_problem(lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), arrays(), workers=4)
    assert plain.model_state(plain.initial_params()) == {}
    assert all(e["kind"] == "param" for e in plain.state_layout())


def test_model_state_is_what_evaluate_computes_and_leaves_the_rng_alone():
    p = problem()
    w = trained(p)
    before = torch.get_rng_state()
    state = p.model_state(w)
    assert torch.equal(torch.get_rng_state(), before)
    assert int(state["2.num_batches_tracked"]) == 1  # 200 samples: one calibration batch
    p.evaluate(w)
    for name, value in p.module.state_dict().items():
        if name in state:
            np.testing.assert_array_equal(value.numpy(), state[name])


def test_exported_model_computes_what_the_evaluation_computes(tmp_path, capsys):
    p = problem()
    w = trained(p)
    run = run_folder(tmp_path, p, w)
    out = tmp_path / "model.pt"
    assert main([str(run), "--out", str(out)]) == 0
    assert "model.pt" in capsys.readouterr().out
    fresh = bn_model()
    fresh.load_state_dict(torch.load(out))
    fresh.eval()
    scores = p.evaluate(w)
    x, y = (torch.from_numpy(a) for a in arrays(60, seed=1))
    p.module.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), p.module(x), rtol=0, atol=0)
        assert float(nn.functional.cross_entropy(fresh(x), y)) == pytest.approx(scores["test_loss"], rel=1e-6)
    p.module.train()
    exported = torch.load(out)
    for name, value in p.state_dict(w).items():  # the problem's own state_dict is the export's
        assert torch.equal(value, exported[name]), name
    result = FitResult({}, run, w, p.module, problem=p)
    assert list(result.state_dict()) == list(exported)
    with pytest.raises(pgc_mpi.ConfigError, match="no state_dict"):
        FitResult({}, run, w).state_dict()


def test_best_a_step_and_a_checkpoint_file_are_exported(tmp_path, capsys):
    p = problem()
    w0, w = p.initial_params(), trained(p)
    run = run_folder(tmp_path, p, w0)
    checkpoint.save(run / "checkpoints", 15, w, FlatOptimizer(w).opt.state_dict(), {}, {},
                    model_state=(p.state_layout(), p.model_state(w)), name="best")
    first = p.state_dict(w0)["1.weight"]
    for which, weight in (("best", p.state_dict(w)["1.weight"]), ("10", first), ("last", first),
                          ("ckpt-00000020.h5", first)):
        out = tmp_path / f"{which}.pt"
        assert main([str(run), "--checkpoint", which, "--out", str(out)]) == 0, capsys.readouterr().err
        assert torch.equal(torch.load(out)["1.weight"], weight)
    assert main([str(run / "checkpoints" / "best.h5"), "--out", str(tmp_path / "file.pt")]) == 0
    assert checkpoint.list_checkpoints(run / "checkpoints")[-1].name == "ckpt-00000020.h5"


def test_a_tied_model_exports_and_loads(tmp_path):
    p = problem(Tied)
    layout = p.state_layout()
    offsets = {e["name"]: e.get("offset") for e in layout}
    assert offsets["dec.weight"] == offsets["head.weight"] and len(p.flat.values) == p.dim == 640 + 20 + 110
    w = trained(p)
    run = run_folder(tmp_path, p, w, steps=(5,))
    out = tmp_path / "tied.pt"
    assert main([str(run), "--out", str(out)]) == 0
    fresh = Tied()
    fresh.load_state_dict(torch.load(out))
    fresh.eval()
    p.evaluate(w)
    p.module.eval()
    x = torch.from_numpy(arrays(30, seed=2)[0])
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), p.module(x), rtol=0, atol=0)


def test_every_bad_input_is_one_line_and_exit_status_2(tmp_path, capsys):
    p = problem()
    w = p.initial_params()
    run = run_folder(tmp_path, p, w)
    out = str(tmp_path / "m.pt")
    empty = tmp_path / "empty"
    empty.mkdir()
    fresh = tmp_path / "fresh"
    (fresh / "checkpoints").mkdir(parents=True)
    (fresh / "config.json").write_text("{}")
    synthetic = tmp_path / "synthetic"
    checkpoint.save(synthetic / "checkpoints", 3, w, FlatOptimizer(w).opt.state_dict(), {}, {})
    cases = [
        ([str(tmp_path / "missing"), "--out", out], "no such run folder"),
        ([str(empty), "--out", out], "is not a run folder"),
        ([str(fresh), "--out", out], "holds no checkpoint"),
        ([str(run), "--checkpoint", "7", "--out", out], "no checkpoint of step 7; its checkpoints are of steps 10, 20"),
        ([str(run), "--checkpoint", "soon", "--out", out], "give a step number, best, last"),
        ([str(run), "--checkpoint", "best", "--out", out], "has no best checkpoint"),
        ([str(run), "--checkpoint", "nope.h5", "--out", out], "no such checkpoint file"),
        ([str(run), "--out", str(tmp_path / "no" / "m.pt")], "does not exist"),
        ([str(run), "--out", str(tmp_path)], "is a folder"),
        ([str(synthetic), "--out", out], "holds no model layout"),
        ([str(run / "checkpoints" / "ckpt-00000010.h5"), "--checkpoint", "best", "--out", out], "is a checkpoint file"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in one_error(capsys), argv
    flipped = run / "checkpoints" / "ckpt-00000010.h5"
    data = bytearray(flipped.read_bytes())
    data[-100] ^= 0x01  # one bit, refused by the checkpoint's digest
    flipped.write_bytes(bytes(data))
    assert main([str(run), "--checkpoint", "10", "--out", out]) == 2
    assert "damaged or incomplete checkpoint (its bytes do not match the digest" in one_error(capsys)
    (run / "checkpoints" / "ckpt-00000020.h5").write_bytes(b"cut short")
    assert main([str(run), "--out", out]) == 2
    assert "not a readable checkpoint" in one_error(capsys)
    assert not (tmp_path / "m.pt").exists() and not list(tmp_path.glob(".m.pt.tmp-*"))


def test_build_model_is_public_and_loads_an_exported_built_in(tmp_path):
    p = torch_problem("mlp", arrays(), workers=4)
    w = trained(p)
    run = run_folder(tmp_path, p, w, steps=(3,))
    out = tmp_path / "mlp.pt"
    assert main([str(run), "--out", str(out)]) == 0
    model = pgc_mpi.build_model("mlp", (1, 8, 8), 10)
    model.load_state_dict(torch.load(out))
    assert torch.equal(torch.nn.utils.parameters_to_vector(model.parameters()), torch.from_numpy(w))
