"""Hostile and broken data files and archives: each is refused with one line naming the file, the
problem and what to do; none hangs, reads files outside itself or exhausts memory."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest

import data_prep.cifar as cifar
from data_prep.__main__ import main as prep
from pgc_mpi.errors import ConfigError, PgcError
from pgc_mpi.learning import h5format
from pgc_mpi.learning.datasets import H5Source, open_dataset
from pgc_mpi.learning.h5format import DataFormatError, checksum, verify_checksum, write_dataset

# -- helpers -----------------------------------------------------------------------------------------


def make_file(path: Path, task: str = "classification", train: int = 40, test: int = 10,
              sample_shape: tuple[int, ...] = (3,), classes: int = 4) -> Path:
    """A small valid data file."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((train + test, *sample_shape)).astype(np.float32)
    if task == "classification":
        y = (np.arange(train + test) % classes).astype(np.int64)
    else:
        y, classes = rng.standard_normal(train + test).astype(np.float32), 1
    return write_dataset(path, "t", (x[:train], y[:train]), (x[train:], y[train:]), classes, "tests",
                         {"method": "none"}, task=task)


def reseal(path: Path) -> None:
    """Store the checksum of the file's current content, as a producer of bad data would."""
    with h5py.File(path, "a") as f:
        f.attrs["checksum"] = checksum([f[s][k][...] for s in ("train", "test") for k in ("x", "y")])


def replace(path: Path, name: str, **kwargs) -> None:
    """Replace dataset `name` by one made with create_dataset(**kwargs)."""
    with h5py.File(path, "a") as f:
        del f[name]
        f.create_dataset(name, **kwargs)


def refused(path: Path, match: str, **kwargs) -> str:
    """open_dataset refuses the file with one line that names it and matches `match`."""
    with pytest.raises(ConfigError) as info:
        open_dataset(str(path), **kwargs)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert str(path) in message, message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no second traceback
    assert re.search(match, message), message
    return message


# -- 1. format_version ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value,match", [
    ("1", r"format_version must be an integer, got the string '1'"),
    (b"1", r"format_version must be an integer, got the string '1'"),
    (np.array([1, 1]), r"format_version must be an integer, got an array of shape \(2,\)"),
    (1.0, r"format_version must be an integer, got the float 1.0"),
    (2, r"format_version 2 is not supported \(this pgc-mpi reads format_version 1\)"),
    (0, r"format_version 0 is not supported"),
    (None, r"no format_version attribute: not a pgc-mpi data file"),
])
def test_format_version_of_the_wrong_type_or_value(tmp_path, value, match):
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        del f.attrs["format_version"]
        if value is not None:
            f.attrs["format_version"] = value
    message = refused(path, match)
    assert "python -m data_prep" in message


@pytest.mark.parametrize("attr,value,match", [
    ("num_classes", "10", r"num_classes must be an integer, got the string '10'"),
    ("task", np.array([1, 2]), r"task must be a string, got an array of shape \(2,\)"),
    ("sample_shape", "3", r"sample_shape must be a list of positive integers"),
    ("sample_shape", np.array([3.0]), r"sample_shape must be a list of positive integers"),
])
def test_other_attributes_of_the_wrong_type(tmp_path, attr, value, match):
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        f.attrs[attr] = value
    refused(path, match)


def test_the_verify_command_reports_one_line(tmp_path, capsys):
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = np.array([1, 2, 3])
    assert prep(["verify", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("data_prep verify: error: ") and str(path) in err


# -- 2. links, external storage, virtual datasets ------------------------------------------------------

def _external_link(path: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as g:
        g["x"] = np.ones((40, 3), np.float32)
    with h5py.File(path, "a") as f:
        del f["train/x"]
        f["train/x"] = h5py.ExternalLink(str(other), "/x")


def _external_group(path: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.h5"
    with h5py.File(path, "r") as f, h5py.File(other, "w") as g:
        f.copy("test", g)
    with h5py.File(path, "a") as f:
        del f["test"]
        f["test"] = h5py.ExternalLink(str(other), "/test")


def _soft_link(path: Path, tmp_path: Path) -> None:
    with h5py.File(path, "a") as f:
        del f["test/y"]
        f["test/y"] = h5py.SoftLink("/elsewhere/y")


def _external_storage(path: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 20)  # like /etc/passwd
    replace(path, "train/x", shape=(40, 3), dtype=np.float32, external=[(str(secret), 0, h5py.h5f.UNLIMITED)])


def _virtual(missing: bool):
    def make(path: Path, tmp_path: Path) -> None:
        source = tmp_path / "source.h5"
        if not missing:
            with h5py.File(source, "w") as g:
                g["x"] = np.ones((40, 3), np.float32)
        layout = h5py.VirtualLayout(shape=(40, 3), dtype=np.float32)
        layout[:] = h5py.VirtualSource(str(source), "/x", shape=(40, 3))
        with h5py.File(path, "a") as f:
            del f["train/x"]
            f.create_virtual_dataset("train/x", layout, fillvalue=0)
    return make


@pytest.mark.parametrize("make,match", [
    (_external_link, r"/train/x is an external link to /x in .*other.h5: the data format admits only"),
    (_external_group, r"/test is an external link to /test in .*other.h5"),
    (_soft_link, r"/test/y is a soft link to /elsewhere/y"),
    (_external_storage, r"/train/x stores its data outside the file \(in .*secret.txt\)"),
    (_virtual(missing=True), r"/train/x is a virtual dataset"),
    (_virtual(missing=False), r"/train/x is a virtual dataset"),
], ids=["external-link", "external-group", "soft-link", "external-storage", "virtual-missing", "virtual"])
def test_objects_not_stored_in_the_file_are_refused(tmp_path, make, match):
    path = make_file(tmp_path / "f.h5")
    make(path, tmp_path)
    reseal_if_possible(path)
    message = refused(path, match)
    assert "self-contained" in message


def reseal_if_possible(path: Path) -> None:
    """Store a checksum that matches, where the content can be read at all, so that only the
    structure is wrong."""
    with contextlib.suppress(OSError, KeyError):
        reseal(path)


def test_names_taken_from_the_file_cannot_break_the_line(tmp_path):
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        del f["test/y"]
        f["test/y"] = h5py.SoftLink("/else\nwhere")
    refused(path, r"/test/y is a soft link to /else\\nwhere")


def refused_in_a_subprocess(path: Path, match: str) -> None:
    """Like `refused`, in a child process with a deadline: a read that blocks in C (opening a FIFO)
    cannot be interrupted in-process, not by pytest-timeout's thread nor by a signal (HDF5
    retries the open on EINTR)."""
    code = ("import sys; from pgc_mpi.learning.datasets import open_dataset; from pgc_mpi.errors import PgcError\n"
            "try:\n    open_dataset(sys.argv[1])\nexcept PgcError as exc:\n    sys.exit(f'error: {exc}')\n")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"opening {path} hung")
    assert done.returncode == 1 and re.search(match, done.stderr), done.stderr


def test_an_external_link_to_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would block forever
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        del f["train/y"]
        f["train/y"] = h5py.ExternalLink(str(fifo), "/y")
    refused_in_a_subprocess(path, r"/train/y is an external link")


def test_a_data_file_that_is_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "data.h5"
    os.mkfifo(fifo)
    refused_in_a_subprocess(fifo, rf"{fifo}: not a regular file")


def test_a_group_where_a_dataset_belongs_is_refused(tmp_path):
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        del f["train/y"]
        f.create_group("train/y")
    refused(path, r"/train/y must be a dataset")


# -- 3. declared sizes -----------------------------------------------------------------------------------

def test_a_trillion_rows_in_a_tiny_file_are_refused_before_allocating(tmp_path):
    path = make_file(tmp_path / "f.h5")
    replace(path, "train/x", shape=(10**12, 3), dtype=np.float32, chunks=(4096, 3))  # fill value, no storage
    replace(path, "train/y", shape=(10**12,), dtype=np.int64, chunks=(4096,))
    assert path.stat().st_size < 100_000
    refused(path, r"the data \(train 1000000000000 x \[3\], test 10 x \[3\]: 20.0 TB\) is more than this "
                  r"machine's memory")


def test_more_data_than_memory_is_refused(tmp_path, monkeypatch):
    from pgc_mpi.learning import h5check

    path = make_file(tmp_path / "f.h5")
    monkeypatch.setattr(h5check, "memory_limit", lambda: 999)
    refused(path, r"the data \(train 40 x \[3\], test 10 x \[3\]: 1.0 kB\) is more than this machine's memory")


@pytest.mark.parametrize("value", [10**12, 100_001, 0, -3])
def test_num_classes_out_of_range(tmp_path, value):
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        f.attrs["num_classes"] = value
    refused(path, rf"num_classes {value} is outside 1\.\.100000")


def test_regression_needs_one_output(tmp_path):
    path = make_file(tmp_path / "r.h5", task="regression")
    with h5py.File(path, "a") as f:
        f.attrs["num_classes"] = 10**12
    refused(path, r"num_classes must be 1 for a regression file")


def test_sample_shape_that_does_not_match_x(tmp_path):
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        f.attrs["sample_shape"] = np.array([1, 28, 28])
    refused(path, r"/train/x must be float32 of shape \[N, 1, 28, 28\]")


def test_rows_of_x_and_y_must_match(tmp_path):
    path = make_file(tmp_path / "f.h5")
    replace(path, "test/y", data=np.zeros(9, np.int64))
    refused(path, r"/test/y must be int64 of shape \[10\]")


def test_huge_chunks_are_refused(tmp_path):
    path = make_file(tmp_path / "f.h5")
    # a chunk far larger than the data: reading one row would decompress a whole 1 GiB chunk
    replace(path, "train/x", shape=(40, 3), dtype=np.float32, chunks=(1, 2**28), maxshape=(None, None))
    refused(path, r"/train/x has chunks of \(1, 268435456\) \(1.1 GB to read at once\), more than the 67.1 MB limit")


def test_too_many_chunks_are_refused(tmp_path, monkeypatch):
    from pgc_mpi.learning import h5check

    monkeypatch.setattr(h5check, "MAX_CHUNKS", 100)
    path = make_file(tmp_path / "f.h5")
    replace(path, "train/x", data=np.zeros((40, 3), np.float32), chunks=(1, 1))
    refused(path, r"/train/x is stored in 120 chunks, more than 100")


# -- 4. content: labels and features ------------------------------------------------------------------------

@pytest.mark.parametrize("bad,match", [
    (-100, r"/train/y\[7\] = -100 is not a class index 0\.\.3 .*ignore_index"),
    (4, r"/train/y\[7\] = 4 is not a class index 0\.\.3"),
    (2**40, r"/train/y\[7\] = 1099511627776 is not a class index 0\.\.3"),
])
def test_labels_outside_the_classes(tmp_path, bad, match):
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        f["train/y"][7] = bad
        f["train/y"][12] = bad
    reseal(path)
    message = refused(path, match)
    assert "train split" in message


def test_float_labels_in_a_classification_file(tmp_path):
    path = make_file(tmp_path / "f.h5")
    replace(path, "train/y", data=np.arange(40, dtype=np.float32) % 4)
    refused(path, r"/train/y must be int64 class indices 0\.\.3 in a classification file, got float32 labels")


@pytest.mark.parametrize("value,name", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_non_finite_features(tmp_path, value, name):
    path = make_file(tmp_path / "f.h5", sample_shape=(2, 3))
    with h5py.File(path, "a") as f:
        x = f["test/x"][...]
        x[6, 1, 2] = value
        x[8, 0, 0] = value
        f["test/x"][...] = x
    reseal(path)
    refused(path, rf"/test/x\[6, 1, 2\] is {name}: the test split's features must be finite")


def test_non_finite_regression_targets(tmp_path):
    path = make_file(tmp_path / "r.h5", task="regression")
    with h5py.File(path, "a") as f:
        f["train/y"][30] = np.nan
    reseal(path)
    refused(path, r"/train/y\[30\] is nan: the train split's regression targets must be finite")


def test_the_first_bad_index_is_found_across_blocks(tmp_path, monkeypatch):
    from pgc_mpi.learning import h5check

    monkeypatch.setattr(h5check, "SCAN_BYTES", 64)  # blocks of a few rows
    path = make_file(tmp_path / "f.h5", train=500)
    with h5py.File(path, "a") as f:
        f["train/y"][333] = 9
        f["train/y"][401] = -1
    reseal(path)
    refused(path, r"/train/y\[333\] = 9")
    monkeypatch.setattr(h5check, "SCAN_BYTES", 1)  # one row at a time, still correct
    refused(path, r"/train/y\[333\] = 9")


def test_the_writer_refuses_what_the_reader_refuses(tmp_path):
    x = np.zeros((4, 2), np.float32)
    x[1, 1] = np.nan
    with pytest.raises(DataFormatError, match=r"train features: \[1, 1\] is nan"):
        write_dataset(tmp_path / "w.h5", "t", (x, np.zeros(4, np.int64)), (x, np.zeros(4, np.int64)), 2, "", {})
    with pytest.raises(DataFormatError, match=r"num_classes 0 is outside 1\.\.100000"):
        write_dataset(tmp_path / "w.h5", "t", (x[:1], np.zeros(1, np.int64)), (x[:1], np.zeros(1, np.int64)), 0,
                      "", {})
    assert not (tmp_path / "w.h5").exists()


# -- 5. checksum ------------------------------------------------------------------------------------------------------

def test_a_checksum_mismatch_is_refused_at_open_unless_skipped(tmp_path):
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        f["test/x"][3, 1] += 1  # still finite: only the checksum can tell
    message = refused(path, r"checksum mismatch \(stored [0-9a-f]{12}\.\.\., content [0-9a-f]{12}\.\.\.\)")
    assert "python -m data_prep verify" in message
    source = open_dataset(str(path), verify_checksum=False)
    assert source.info.num_test == 10
    source.close()
    with pytest.raises(DataFormatError, match="checksum mismatch"):
        verify_checksum(path)


def test_a_missing_checksum_is_refused_unless_skipped(tmp_path):
    path = make_file(tmp_path / "f.h5")
    with h5py.File(path, "a") as f:
        del f.attrs["checksum"]
    refused(path, r"no checksum attribute")
    H5Source(path, verify_checksum=False).close()


def test_a_valid_file_reads_the_same_after_the_checks(tmp_path):
    path = make_file(tmp_path / "f.h5", train=300, sample_shape=(2, 5))
    with h5py.File(path, "r") as f:
        want = f["train/x"][...], f["train/y"][...]
    src = H5Source(path)
    got = src.read_split("train")
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert (src.info.num_train, src.info.num_test, src.info.num_classes, src.info.sample_shape) == (300, 10, 4, (2, 5))
    assert src.info.name == "t" and src.info.source == "tests"
    src.close()
    assert verify_checksum(path) == checksum([want[0], want[1], *H5Source(path).read_split("test")])


# -- 6. the CIFAR-10 archive ----------------------------------------------------------------------------

BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def _batch_bytes(per_batch: int = 4) -> bytes:
    data = np.zeros((per_batch, 3072), np.uint8)
    return pickle.dumps({b"labels": [0] * per_batch, b"data": data}, protocol=2)


def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, raw in members:
            tar.addfile(info, io.BytesIO(raw) if raw is not None else None)
    return path


def _member(name: str, raw: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
    info.size = len(raw)
    return info, raw


def _cifar_error(capsys, archive: Path, tmp_path: Path) -> str:
    assert prep(["cifar10", str(archive), "--out", str(tmp_path / "o.h5")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("data_prep cifar10: error: ") and str(archive) in err
    assert not (tmp_path / "o.h5").exists()
    return err


def test_a_member_that_declares_a_huge_size_is_refused_before_reading(tmp_path, capsys):
    info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
    info.size = 5 * 2**30  # the header claims 5 GiB; the archive holds none of it
    path = tmp_path / "huge.tar"
    with tarfile.open(path, "w") as tar:
        tar.addfile(info)  # header only
    gz = tmp_path / "huge.tar.gz"
    import gzip

    gz.write_bytes(gzip.compress(path.read_bytes()))
    err = _cifar_error(capsys, gz, tmp_path)
    assert "data_batch_1 declares 5368709120 bytes" in err and "33554432" in err


def test_a_member_larger_than_the_limit_is_refused_before_reading(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cifar, "MEMBER_LIMIT", 1000)
    members = [_member(name, _batch_bytes()) for name in BATCHES]
    err = _cifar_error(capsys, _archive(tmp_path / "c.tar.gz", members), tmp_path)
    assert "data_batch_1 declares 12560 bytes" in err and "limit 1000" in err


def test_a_header_that_lies_is_caught_by_the_bounded_read(tmp_path, capsys, monkeypatch):
    # as if the header said 500 bytes while the member holds 12560: no more than 501 are read
    monkeypatch.setattr(cifar, "MEMBER_LIMIT", 1000)
    monkeypatch.setattr(cifar, "_declared_size", lambda member: 500)
    reads: list[int] = []
    real = tarfile.ExFileObject.read

    def spy(self, size=-1):
        reads.append(size)
        return real(self, size)

    monkeypatch.setattr(tarfile.ExFileObject, "read", spy)
    members = [_member(name, _batch_bytes()) for name in BATCHES]
    err = _cifar_error(capsys, _archive(tmp_path / "c.tar.gz", members), tmp_path)
    assert "data_batch_1 holds more than 500 bytes" in err
    assert reads == [501]


def test_an_archive_that_decompresses_to_too_much_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cifar, "TOTAL_LIMIT", 200_000)
    filler = tarfile.TarInfo("cifar-10-batches-py/readme.html")
    filler.size = 300_000
    members = [(filler, bytes(300_000))] + [_member(name, _batch_bytes()) for name in BATCHES]
    err = _cifar_error(capsys, _archive(tmp_path / "c.tar.gz", members), tmp_path)
    assert "decompresses to more than 200000 bytes" in err


def test_a_huge_pax_header_is_refused(tmp_path, capsys, monkeypatch):
    # tarfile reads a pax header whole, before any member is seen: only the total bound stops it
    monkeypatch.setattr(cifar, "TOTAL_LIMIT", 200_000)
    info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
    info.pax_headers = {"comment": "x" * 1_000_000}
    raw = _batch_bytes()
    info.size = len(raw)
    path = tmp_path / "pax.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(raw))
    err = _cifar_error(capsys, path, tmp_path)
    assert "decompresses to more than 200000 bytes" in err


def test_links_and_duplicates_in_the_archive_are_refused(tmp_path, capsys):
    link = tarfile.TarInfo("cifar-10-batches-py/test_batch")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    members = [_member(name, _batch_bytes()) for name in BATCHES[:-1]] + [(link, None)]
    err = _cifar_error(capsys, _archive(tmp_path / "l.tar.gz", members), tmp_path)
    assert "test_batch is not a regular file" in err
    members = [_member(name, _batch_bytes()) for name in BATCHES] + [_member("data_batch_2", _batch_bytes())]
    members = members[:2] + members[-1:] + members[2:-1]
    err = _cifar_error(capsys, _archive(tmp_path / "d.tar.gz", members), tmp_path)
    assert "data_batch_2 appears twice" in err


# -- 7. disk full ------------------------------------------------------------------------------------------

def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.suffix == ".h5" or ".tmp-" in p.name]


@pytest.mark.parametrize("where", ["write", "fsync"])
def test_disk_full_while_writing_a_data_file(tmp_path, capsys, monkeypatch, where):
    monkeypatch.setattr(os, where, _enospc)  # fsync: where delayed allocation and NFS report it
    out = tmp_path / "s.h5"
    assert prep(["synthetic", "--samples", "50", "--out", str(out)]) == 1
    monkeypatch.undo()
    err = capsys.readouterr().err.strip()
    assert err == f"data_prep synthetic: error: {out}: cannot write: no space left on device; " \
                  f"free some space or write it elsewhere", err
    assert _leftovers(tmp_path) == []


def test_disk_full_while_writing_a_checkpoint(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from pgc_mpi.runs import checkpoint

    param = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    (tmp_path / "ck").mkdir()
    monkeypatch.setattr(os, "write", _enospc)
    with pytest.raises(PgcError) as info:
        checkpoint.save(tmp_path / "ck", 12, np.zeros(3, np.float32), opt.state_dict(), {"seed": 0}, {})
    monkeypatch.undo()
    message = str(info.value)
    assert message == f"{tmp_path / 'ck' / 'ckpt-00000012.h5'}: cannot write: no space left on device; " \
                      f"free some space or write it elsewhere"
    assert info.value.__suppress_context__
    assert _leftovers(tmp_path / "ck") == []


def test_a_real_short_write_is_one_line_and_leaves_nothing(tmp_path):
    # A real kernel refusal, without mounting a full file system: a file size limit (EFBIG).
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
            "from data_prep.__main__ import main\n"
            "sys.exit(main(['synthetic', '--samples', '5000', '--out', sys.argv[1]]))\n")
    out = tmp_path / "s.h5"
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"data_prep synthetic: error: {out}: cannot write: File too large", done.stderr
    assert _leftovers(tmp_path) == []


def test_other_write_failures_are_one_line_too(tmp_path):
    target = tmp_path / "missing-dir-is-a-file"
    target.write_text("")
    with pytest.raises(h5format.WriteError, match=r"cannot write: (Not a directory|File exists)"):
        make_file(target / "f.h5")
