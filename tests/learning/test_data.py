"""data_prep converters, the HDF5 layout, partition-aware reading, models on flat buffers."""

from __future__ import annotations

import copy
import gzip
import io
import os
import pickle
import struct
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from data_prep.__main__ import main as prep
from pgc_mpi.choices import MODELS
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.datasets import H5Source, digits_arrays, load_digits, open_dataset
from pgc_mpi.learning.h5format import DataFormatError, verify_checksum
from pgc_mpi.learning.torch_problem import TorchProblem, build_model

from helpers import require_fashion_mnist


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> None:
    """An IDX file of unsigned bytes, as the official MNIST files are written."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


@pytest.fixture
def idx_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    d = tmp_path / "idx"
    d.mkdir()
    for split, count in (("train", 50), ("t10k", 20)):
        write_idx(d / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (count, 6, 5)))
        write_idx(d / f"{split}-labels-idx1-ubyte.gz", np.arange(count) % 4)
    return d


def write_cifar(path: Path, per_batch: int = 6, corrupt_member: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A small archive in the official cifar-10-python.tar.gz format (Python-2 style pickles)."""
    rng = np.random.default_rng(1)
    images, labels = [], []
    with tarfile.open(path, "w:gz") as tar:
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        for name in names:
            data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
            lab = [int(v) for v in rng.integers(0, 10, per_batch)]
            images.append(data)
            labels.append(lab)
            raw = pickle.dumps({b"batch_label": name.encode(), b"labels": lab, b"data": data,
                                b"filenames": [b"x.png"] * per_batch}, protocol=2)
            if name == corrupt_member:
                raw = raw[: len(raw) // 2]
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
        meta = pickle.dumps({b"label_names": [b"c%d" % i for i in range(10)]}, protocol=2)
        info = tarfile.TarInfo("cifar-10-batches-py/batches.meta")
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
    return np.concatenate(images), np.concatenate(labels)


def no_leftovers(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if p.suffix == ".h5" or ".tmp-" in p.name]


# -- converters round-trip -------------------------------------------------------------------------

def test_digits_round_trip(tmp_path):
    out = tmp_path / "d.h5"
    assert prep(["digits", "--out", str(out), "--normalize", "unit"]) == 0
    src = H5Source(out)
    assert src.info.num_train + src.info.num_test == 1797 and src.info.sample_shape == (1, 8, 8)
    x, y = src.read_split("train")
    assert y.min() == 0 and y.max() == 9 and x.dtype == np.float32 and x.min() >= 0 and x.max() <= 1
    raw_x, raw_y = digits_arrays()
    assert sorted(np.concatenate([y, src.read_split("test")[1]])) == sorted(raw_y)
    builtin = load_digits(0)
    np.testing.assert_allclose(x, builtin.read_split("train")[0])
    verify_checksum(out)


def test_idx_round_trip_and_normalization_recorded(tmp_path, idx_dir):
    out = tmp_path / "m.h5"
    assert prep(["idx", "--dir", str(idx_dir), "--name", "tiny", "--out", str(out), "--normalize", "unit"]) == 0
    with h5py.File(out) as f:
        x = f["train/x"][...]
        assert f.attrs["name"] == "tiny" and f.attrs["num_classes"] == 4 and '"scale"' in f.attrs["normalization"]
    raw = np.frombuffer(gzip.decompress((idx_dir / "train-images-idx3-ubyte.gz").read_bytes())[16:], np.uint8)
    np.testing.assert_allclose(x.reshape(-1) * 255, raw.astype(np.float32), atol=1e-4)
    assert prep(["idx", "--dir", str(idx_dir), "--out", str(tmp_path / "s.h5")]) == 0  # standardized
    xs = H5Source(tmp_path / "s.h5").read_split("train")[0]
    assert abs(float(xs.mean())) < 1e-4 and abs(float(xs.std()) - 1) < 1e-3


def test_cifar10_round_trip(tmp_path):
    archive = tmp_path / "cifar-10-python.tar.gz"
    images, labels = write_cifar(archive)
    out = tmp_path / "c.h5"
    assert prep(["cifar10", str(archive), "--out", str(out), "--normalize", "unit"]) == 0
    src = H5Source(out)
    assert src.info.sample_shape == (3, 32, 32) and src.info.num_train == 30 and src.info.num_test == 6
    x, y = src.read_split("train")
    np.testing.assert_allclose(x.reshape(30, -1) * 255, images[:30], atol=1e-3)
    np.testing.assert_array_equal(y, labels[:30])


@pytest.mark.parametrize("kind,task,dtype", [("least-squares", "regression", np.float32),
                                             ("logistic", "classification", np.int64),
                                             ("nonconvex", "classification", np.int64)])
def test_synthetic_sets(tmp_path, kind, task, dtype):
    out = tmp_path / f"{kind}.h5"
    assert prep(["synthetic", "--kind", kind, "--samples", "300", "--features", "7", "--classes", "3",
                 "--out", str(out)]) == 0
    src = H5Source(out)
    assert src.info.task == task and src.info.sample_shape == (7,) and src.info.num_train == 240
    assert src.read_split("test")[1].dtype == dtype
    again = tmp_path / "again.h5"
    prep(["synthetic", "--kind", kind, "--samples", "300", "--features", "7", "--classes", "3", "--out", str(again)])
    assert verify_checksum(out) == verify_checksum(again)  # seeded: the same content


def test_fashion_mnist_from_the_debian_package(tmp_path):
    require_fashion_mnist()
    out = tmp_path / "fm.h5"
    assert prep(["fashion-mnist", "--out", str(out)]) == 0
    src = H5Source(out)
    assert (src.info.num_train, src.info.num_test, src.info.num_classes) == (60000, 10000, 10)
    assert src.info.sample_shape == (1, 28, 28)


# -- bad input ---------------------------------------------------------------------------------------

def _prep_error(capsys, argv: list[str]) -> str:
    assert prep(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error:" in err
    return err


def test_idx_bad_inputs(tmp_path, idx_dir, capsys):
    out = tmp_path / "o.h5"
    args = ["idx", "--dir", str(idx_dir), "--out", str(out)]
    (idx_dir / "t10k-labels-idx1-ubyte.gz").rename(tmp_path / "keep.gz")
    assert "no such file" in _prep_error(capsys, args)
    (tmp_path / "keep.gz").rename(idx_dir / "t10k-labels-idx1-ubyte.gz")
    good = (idx_dir / "train-images-idx3-ubyte.gz").read_bytes()
    (idx_dir / "train-images-idx3-ubyte.gz").write_bytes(good[: len(good) // 2])
    assert "truncated or corrupt" in _prep_error(capsys, args)
    (idx_dir / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(b"\x01\x02\x03\x04garbage"))
    assert "bad magic" in _prep_error(capsys, args)
    raw = gzip.decompress(good)
    (idx_dir / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw[:-7]))
    assert "header promises" in _prep_error(capsys, args)
    (idx_dir / "train-images-idx3-ubyte.gz").write_bytes(good)
    write_idx(idx_dir / "train-labels-idx1-ubyte.gz", np.arange(49) % 4)
    assert "50 images but" in _prep_error(capsys, args)
    assert no_leftovers(tmp_path)


def test_cifar_bad_inputs(tmp_path, capsys):
    out = tmp_path / "o.h5"
    assert "no such file" in _prep_error(capsys, ["cifar10", str(tmp_path / "none.tar.gz"), "--out", str(out)])
    archive = tmp_path / "c.tar.gz"
    write_cifar(archive)
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    assert "truncated or corrupt" in _prep_error(capsys, ["cifar10", str(archive), "--out", str(out)])
    write_cifar(archive, corrupt_member="data_batch_3")
    assert "data_batch_3 is not a CIFAR-10 batch" in _prep_error(capsys, ["cifar10", str(archive), "--out", str(out)])
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        raw = pickle.dumps({b"data": os.system}, protocol=2)  # a pickle that would call a function
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    assert "refusing to load" in _prep_error(capsys, ["cifar10", str(evil), "--out", str(out)])
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".h5" or ".tmp-" in p.name] == []


def test_bad_hdf5_files_are_clear_errors(tmp_path):
    good = tmp_path / "good.h5"
    prep(["synthetic", "--samples", "50", "--out", str(good)])
    with pytest.raises(ConfigError, match="no such data file"):
        open_dataset(str(tmp_path / "missing.h5"))
    (tmp_path / "junk.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(ConfigError, match="not a readable HDF5 file"):
        open_dataset(str(tmp_path / "junk.h5"))
    nosplit = tmp_path / "nosplit.h5"
    nosplit.write_bytes(good.read_bytes())
    with h5py.File(nosplit, "a") as f:
        del f["test"]
    with pytest.raises(ConfigError, match="missing the 'test' split"):
        open_dataset(str(nosplit))
    wrong = tmp_path / "wrong.h5"
    wrong.write_bytes(good.read_bytes())
    with h5py.File(wrong, "a") as f:
        y = f["train/y"][...]
        del f["train/y"]
        f["train/y"] = y.astype(np.float64)
    with pytest.raises(ConfigError, match="/train/y must be int64"):
        open_dataset(str(wrong))
    with pytest.raises(DataFormatError, match="checksum mismatch"):
        tampered = tmp_path / "tampered.h5"
        tampered.write_bytes(good.read_bytes())
        with h5py.File(tampered, "a") as f:
            f["train/x"][0, 0] += 1
        verify_checksum(tampered)
    with pytest.raises(ConfigError, match="neither a built-in data set"):
        open_dataset("cifar100")


# -- partition-aware reading, models ----------------------------------------------------------------

def test_h5_reader_returns_exactly_the_requested_rows(tmp_path):
    out = tmp_path / "s.h5"
    prep(["synthetic", "--samples", "200", "--features", "3", "--out", str(out)])
    src = H5Source(out)
    x_all, y_all = src.read_split("train")
    rows = np.array([0, 5, 6, 77, 159])
    x, y = src.read_train(rows)
    np.testing.assert_array_equal(x, x_all[rows])
    np.testing.assert_array_equal(y, y_all[rows])


def test_a_worker_loads_only_its_partitions(tmp_path):
    src = load_digits(0)
    prob = TorchProblem("logreg", src, 6, 16, partitions=[4, 1])
    assert sorted(prob.minibatches.held) == [1, 4]
    x, _ = prob.minibatches.held[4]
    np.testing.assert_array_equal(x.numpy(), src.read_train(prob.partitions[4])[0])
    with pytest.raises(KeyError, match="not stored here"):
        prob.loss_and_grad(prob.initial_params(), 0, 0)


@pytest.mark.parametrize("model", MODELS)
def test_flat_buffer_gradients_equal_torch_autograd(model):
    src = load_digits(0)
    prob = TorchProblem(model, src, 4, 16, seed=2)
    reference = copy.deepcopy(prob.module)
    w = prob.initial_params() + 0.01
    loss, g = prob.loss_and_grad(w, 2, 5)
    # the same batch through a plain module with its own parameters and autograd
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.from_numpy(w), reference.parameters())
    for p in reference.parameters():
        p.grad = None
    x, y = prob.minibatches.held[2]
    from pgc_mpi.core.sampling import minibatch_positions

    pos = torch.from_numpy(minibatch_positions(len(y), 16, 5, 2, 2))
    reference.train()
    ref_loss = torch.nn.functional.cross_entropy(reference(x[pos]), y[pos])
    ref_loss.backward()
    ref_grad = torch.cat([p.grad.reshape(-1) for p in reference.parameters()]).numpy()
    assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-6)
    np.testing.assert_allclose(g, ref_grad, rtol=1e-5, atol=1e-7)


def test_resnet18_has_the_cifar_size():
    count = sum(p.numel() for p in build_model("resnet18", (3, 32, 32), 10).parameters())
    assert 11.1e6 < count < 11.3e6


def test_model_that_does_not_fit_the_data_is_a_clear_error(tmp_path):
    out = tmp_path / "s.h5"
    prep(["synthetic", "--samples", "50", "--features", "4", "--out", str(out)])
    with pytest.raises(ConfigError, match="needs image samples"):
        TorchProblem("cnn", open_dataset(str(out)), 2, 8)


def test_evaluation_covers_every_sample_including_the_last_partial_batch(monkeypatch):
    import pgc_mpi.learning.torch_problem as models

    monkeypatch.setattr(models, "EVAL_BATCH", 97)  # 360 test samples: 3 full batches and one of 69
    src = load_digits(0)
    prob = TorchProblem("mlp", src, 3, 16)
    ev = prob.evaluate(prob.initial_params())
    x, y = src.read_split("test")
    with torch.no_grad():
        out = prob.module(torch.from_numpy(x))
        full = float(torch.nn.functional.cross_entropy(out, torch.from_numpy(y)))
        acc = float((out.argmax(1) == torch.from_numpy(y)).float().mean())
    assert ev["test_loss"] == pytest.approx(full, rel=1e-5) and ev["test_accuracy"] == pytest.approx(acc)


def test_batch_norm_statistics_are_recomputed_before_evaluation():
    prob = TorchProblem("resnet18", load_digits(0), 2, 8, eval_train=False)
    bn = prob.module.stem[1]
    ev = prob.evaluate(prob.initial_params())
    assert 0 < ev["test_accuracy"] <= 1 and bn.num_batches_tracked > 0 and float(bn.running_var.mean()) != 1.0


def test_regression_task_uses_half_squared_error(tmp_path):
    out = tmp_path / "ls.h5"
    prep(["synthetic", "--kind", "least-squares", "--samples", "100", "--features", "3", "--out", str(out)])
    prob = TorchProblem("linear", open_dataset(str(out)), 2, None)
    w = prob.initial_params()
    x, y = prob.minibatches.held[0]
    loss, _ = prob.loss_and_grad(w, 0, 0)
    with torch.no_grad():
        pred = prob.module(x).squeeze(1)
    assert loss == pytest.approx(float(0.5 * ((pred - y) ** 2).mean()), rel=1e-5)
    assert set(prob.evaluate(w)) == {"train_loss", "test_loss"}
