"""A damaged run folder never crashes a reader: fuzzing messages.bin, metrics.jsonl and config.json
of a small real (simulated) run. A reader loses exactly the steps whose bytes were damaged, says
which, and gives back every other step exactly as the undamaged read did."""

from __future__ import annotations

import random
import shutil
import warnings

import pytest

from pgc_mpi.errors import RunDataError
from pgc_mpi.runs.message_log import HEADER, NAME, DetailLostWarning, scan, step_ranges
from pgc_mpi.runs.metrics import DamagedLinesWarning, read_metrics
from pgc_mpi.runs.results import load_run, read_steps

STEPS = 12


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 12-step pgc-cr run folder of the simulator (6 workers, exponential delays) and its undamaged read."""
    from pgc_mpi.sim.backend import run_simulated

    out = tmp_path_factory.mktemp("run")
    run_simulated({"scheme": "pgc-cr", "stragglers": 1, "steps": STEPS, "eval_every": 4, "compute_time": 0.3,
                   "delay": "exp:1.0", "seed": 3}, 6, out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the undamaged folder reads without a warning
        whole = read_steps(out)
    assert len(whole) == STEPS and all("messages" in r for r in whole)
    return out, whole


def _read(folder) -> tuple[list[dict], list[str]]:
    """read_steps of `folder` and the texts of the warnings it gave (it must not raise)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps = read_steps(folder)
    return steps, [str(w.message) for w in caught if issubclass(w.category, (DetailLostWarning,
                                                                           DamagedLinesWarning))]


def _check(folder, whole: list[dict], lost: set[int]) -> None:
    """read_steps of `folder` does not raise; every step is there; exactly `lost` lost their detail
    (and one warning names each); the others are the undamaged read's."""
    steps, said = _read(folder)
    assert [r["step"] for r in steps] == [r["step"] for r in whole]
    assert {r["step"] for r in steps if r.get("detail_lost")} == lost
    for got, want in zip(steps, whole):
        if got["step"] not in lost:
            assert got == want
    if lost:
        assert len(said) == 1 and step_ranges(sorted(lost)) in said[0]
    else:
        assert not said


@pytest.fixture
def copy_of(run, tmp_path):
    """A fresh copy of the run folder to damage, and the undamaged read."""
    out, whole = run
    folder = tmp_path / "copy"
    shutil.copytree(out, folder)
    return folder, whole


def _blocks(data: bytes) -> list[tuple[int, int, int]]:
    """(start, end, step) of each block of an undamaged messages.bin."""
    spans, at = [], 0
    for end, block in scan_bytes(data):
        spans.append((at, end, block.step))
        at = end
    return spans


def scan_bytes(data: bytes):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / NAME
        path.write_bytes(data)
        found, damage = scan(path)
    assert not damage
    return found


def test_a_flipped_byte_anywhere_in_messages_bin_loses_only_its_block(copy_of):
    """Every byte of the file flipped (three different ways at each position of the first blocks'
    headers, where the fields that say how to decode are): the block holding it is lost, no other."""
    folder, whole = copy_of
    path = folder / NAME
    data = path.read_bytes()
    spans = _blocks(data)
    assert len(spans) == STEPS
    rng = random.Random(0)
    trials = [(at, rng.randrange(1, 256)) for at in range(len(data))]
    trials += [(at, mask) for at in range(3 * HEADER.size) for mask in (0x01, 0x80, 0xFF)]
    for at, mask in trials:
        damaged = bytearray(data)
        damaged[at] ^= mask
        path.write_bytes(bytes(damaged))
        _check(folder, whole, {next(step for start, end, step in spans if start <= at < end)})


def test_messages_bin_cut_anywhere_loses_the_blocks_from_the_cut(copy_of):
    folder, whole = copy_of
    path = folder / NAME
    data = path.read_bytes()
    spans = _blocks(data)
    cuts = sorted({start for start, _, _ in spans} | {start + k for start, end, _ in spans
                                                      for k in (1, HEADER.size - 1, HEADER.size, (end - start) // 2)})
    for cut in cuts:
        path.write_bytes(data[:cut])
        _check(folder, whole, {step for start, end, step in spans if end > cut})


def test_garbage_appended_or_blocks_swapped_lose_nothing(copy_of):
    folder, whole = copy_of
    path = folder / NAME
    data = path.read_bytes()
    spans = _blocks(data)
    rng = random.Random(1)
    for size in (1, 7, HEADER.size, 500):
        path.write_bytes(data + rng.randbytes(size))
        _check(folder, whole, set())
        path.write_bytes(data + b"PGCm" + rng.randbytes(size))  # garbage that starts like a block
        _check(folder, whole, set())
    (a0, a1, _), (b0, b1, _) = spans[2], spans[7]
    path.write_bytes(data[:a0] + data[b0:b1] + data[a1:b0] + data[a0:a1] + data[b1:])
    _check(folder, whole, set())


def _line_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each line, its newline included."""
    spans, at = [], 0
    for line in data.splitlines(keepends=True):
        spans.append((at, at + len(line)))
        at += len(line)
    return spans


def test_a_flipped_byte_in_metrics_jsonl_loses_only_its_line(copy_of):
    """Every byte of the first line and 500 positions spread over the rest of the file: the
    step records of the damaged line (and of the next, when the newline between them is hit) are
    missing and named, every other record reads as before, with its detail."""
    folder, whole = copy_of
    path = folder / "metrics.jsonl"
    data = path.read_bytes()
    spans = _line_spans(data)
    records = read_metrics(path)
    assert len(records) == len(spans) and all("crc32" not in r for r in records)
    rng = random.Random(2)
    positions = list(range(spans[0][1])) + rng.sample(range(spans[0][1], len(data)), 500)
    for at in positions:
        damaged = bytearray(data)
        damaged[at] ^= rng.randrange(1, 256)
        path.write_bytes(bytes(damaged))
        line = next(i for i, (start, end) in enumerate(spans) if start <= at < end)
        hit = {line, line + 1} if at == spans[line][1] - 1 else {line}  # the newline: two lines become one
        gone = {records[i].get("step") for i in hit if i < len(records) and "event" not in records[i]}
        steps, said = _read(folder)
        assert [r["step"] for r in steps] == [r["step"] for r in whole if r["step"] not in gone]
        assert all(got == want for got, want in zip(steps, (r for r in whole if r["step"] not in gone)))
        assert said and all(str(step) in said[0] for step in gone)


def test_metrics_jsonl_cut_short_keeps_the_lines_before_the_cut(copy_of):
    folder, whole = copy_of
    path = folder / "metrics.jsonl"
    data = path.read_bytes()
    for start, end in _line_spans(data)[::3]:
        cut = (start + end) // 2
        path.write_bytes(data[:cut])
        steps, said = _read(folder)
        with pytest.warns(DamagedLinesWarning, match="line"):
            kept = [r for r in read_metrics(folder / "metrics.jsonl") if "event" not in r]
        assert steps == whole[:len(kept)] and said


def test_a_metrics_jsonl_written_before_lines_carried_a_crc_still_reads(copy_of):
    import json

    folder, whole = copy_of
    path = folder / "metrics.jsonl"
    lines = [json.dumps(r) for r in read_metrics(path)]
    path.write_text("\n".join(lines) + "\n" + lines[3][:20] + "\n")  # and a line cut short
    steps, said = _read(folder)
    assert steps == whole and len(said) == 1 and "line" in said[0]


@pytest.mark.parametrize("damage", [b"", b"{\"config\": {", b"[1, 2]", b"\xff\xfe{}"])
def test_a_damaged_config_json_is_one_line_naming_the_file(copy_of, damage):
    folder, _ = copy_of
    (folder / "config.json").write_bytes(damage)
    with pytest.raises(RunDataError) as caught:
        load_run(folder)
    message = str(caught.value)
    assert "\n" not in message and str(folder / "config.json") in message and "damaged" in message
