"""messages.bin (pgc_mpi.runs.message_log): step records' per-message lists out of metrics.jsonl and back."""

from __future__ import annotations

import json
import math

import pytest

from pgc_mpi.core.message import MessageRecord
from pgc_mpi.runs.message_log import FORMAT, HEADER, NAME, DetailLostWarning, blocks, pack, scan
from pgc_mpi.runs.metrics import MetricsWriter, _plain, read_metrics
from pgc_mpi.runs.results import read_steps
from pgc_mpi.runs.run_folder import OUTPUTS

HEADER_SIZE = HEADER.size
LISTS = ("messages", "arrivals", "used", "rejected", "versions", "ages")
COUNTS = ("n_messages", "n_arrivals", "n_used")


def _json(record: dict) -> dict:
    """A record as metrics.jsonl held it before messages.bin: what read_steps must give back."""
    return json.loads(json.dumps(_plain(record)))


def _same(got: dict, record: dict) -> None:
    """`got` (read back) is `record` (in memory) in its JSON form, times to the nanosecond, plus the counts."""
    want = _json(record)
    assert {k: v for k, v in got.items() if k not in ("time", *COUNTS, "messages")} == \
        {k: v for k, v in want.items() if k != "messages"}
    assert [m[:2] + m[4:6] for m in got["messages"]] == [m[:2] + m[4:6] for m in want["messages"]]
    for mine, theirs in zip(got["messages"], want["messages"], strict=True):
        for k in (2, 3, 6, 7, 8):  # delay, compute_time, real_compute_time, turnaround, data_wait
            assert (mine[k] is None) == (theirs[k] is None)
            assert mine[k] is None or mine[k] == pytest.approx(theirs[k], abs=0.51e-9)
    assert got["n_messages"] == len(record["messages"]) and got["n_used"] == len(record["used"])


def _write(out, records, keep_steps_before=None):
    metrics = MetricsWriter(out, keep_steps_before)  # messages.bin with it
    for record in records:
        metrics.write(record)
    metrics.close()


@pytest.mark.parametrize("scheme, options", [("pgc-cr", {}), ("pbs", {"max_staleness": 1})])
def test_a_simulated_run_folder_reads_back_as_the_simulator_recorded_it(tmp_path, scheme, options):
    from pgc_mpi.learning.torch_problem import load_problem
    from pgc_mpi.sim.backend import run_simulated, sim_config
    from pgc_mpi.sim.simulator import simulate

    options = {"scheme": scheme, "stragglers": 1, "steps": 25, "eval_every": 5, "compute_time": 0.3,
               "delay": "random:2:2.5" if scheme == "pbs" else "exp:1.0", "seed": 3, **options}
    run_simulated(options, 6, tmp_path)
    direct = simulate(sim_config(options, 6), load_problem("digits", "logreg", 6, 32, seed=3))
    got = read_steps(tmp_path)
    assert len(got) == len(direct.records) == 25
    for mine, record in zip(got, direct.records):
        _same(mine, record)
    assert ("ages" in got[0]) == (scheme == "pbs") and ("versions" in got[0]) == (scheme != "pbs")
    if scheme == "pbs":
        assert any(r["rejected"] for r in got)  # over --max-staleness: flagged, listed again
    # metrics.jsonl itself holds no per-worker list, and the other records are untouched
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert not any(key in line for line in lines for key in LISTS)
    assert [r["event"] for r in lines if "event" in r] == ["eval"] * 5 + ["summary"]


def _coded_record() -> dict:
    """A coded step as CodedCollector.record builds it: late, over-stale, malformed, used and unused messages."""
    messages = [MessageRecord(3, 6, 0.25, 0.5, 2, "late", 0.4, 0.9),
                MessageRecord(1, 7, 0.0, 1e-3, 1, "used", 1e-4, 0.0012345678912, 2.5e-4),
                MessageRecord(2, 7, 1.5, 0.5, 1, "stale", math.nan, 2.0001), MessageRecord.rejected(0),
                MessageRecord(0, 7, 3.0, 0.5, 1, "accepted", 0.2, math.nan),
                MessageRecord(4, 7, 0.1, 0.5, 1, "used", 0.1, math.inf)]
    return {"step": 7, "wall_time": 1.0, "arrivals": [1, 0, 4], "used": [1, 4], "late": 1, "rejected": [2],
            "stale_rejected": 1, "messages": messages, "versions": {1: [7, 6], 0: [7, 5], 4: [7, 6]},
            "train_loss": 0.5}


def _pbs_record() -> dict:
    """A pbs step: a worker's several messages, stale against the table (arrived) and over the bound (not)."""
    messages = [MessageRecord(2, 4, 0.1, 0.5, 1, "stale"), MessageRecord(2, 5, 0.2, 0.5, 1, "used"),
                MessageRecord(0, 2, 0.3, 0.5, 1, "stale"), MessageRecord(1, 5, 0.4, 0.5, 1, "used"),
                MessageRecord(0, 5, 0.5, 0.5, 1, "stale")]
    return {"step": 5, "arrivals": [2, 2, 1, 0], "used": [2, 2, 1, 0], "rejected": [0], "messages": messages,
            "ages": [0, 1, -1], "new_gradients": 2}


@pytest.mark.parametrize("record", [_coded_record(), _pbs_record()], ids=["coded", "pbs"])
def test_the_lists_come_back_exactly(tmp_path, record):
    _write(tmp_path, [record])
    (got,) = read_steps(tmp_path)
    _same(got, record)
    slim = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert not set(slim) & set(LISTS) and slim["n_arrivals"] == len(record["arrivals"])


def test_times_given_with_few_decimals_come_back_exactly_and_nan_as_none(tmp_path):
    _write(tmp_path, [_coded_record()])
    (got,) = read_steps(tmp_path)
    assert got["messages"][0] == [3, 6, 0.25, 0.5, 2, "late", 0.4, 0.9, None]
    assert got["messages"][1][3:] == [1e-3, 1, "used", 1e-4, 0.001234568, 2.5e-4]  # the turnaround to the ns
    assert got["messages"][2][6] is None and got["messages"][2][7] == 2.0001
    assert got["messages"][3] == [0, -1, None, None, 0, "rejected", None, None, None]
    assert got["messages"][4][7] is None and got["messages"][5][7] is None  # nan, and inf as json.dumps gives it


def test_a_list_the_flags_cannot_express_stays_in_the_json(tmp_path):
    odd = {**_coded_record(), "arrivals": [4, 1, 0], "versions": {4: [7, 6], 1: [7, 6], 0: [7, 5]}}
    slim, block = pack(odd)
    assert slim["arrivals"] == [4, 1, 0] and slim["versions"] == odd["versions"] and "used" in slim
    assert "messages" not in slim and "rejected" not in slim
    _write(tmp_path, [odd, {"step": 8, "train_loss": 1.0}])  # and a record without messages passes as it is
    got = read_steps(tmp_path)
    _same(got[0], odd)
    assert got[1] == {"step": 8, "train_loss": 1.0, "time": got[1]["time"]}


def test_a_truncated_or_damaged_last_block_is_ignored(tmp_path):
    records = [{**_coded_record(), "step": t} for t in range(5)]
    _write(tmp_path, records)
    path = tmp_path / NAME
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # killed while writing the last block
    assert [b.step for _, b in blocks(path)] == [0, 1, 2, 3]
    with pytest.warns(DetailLostWarning, match=r"detail of 1 step is lost \(step 4\); damaged: bytes"):
        got = read_steps(tmp_path)
    assert all("messages" in r and "detail_lost" not in r for r in got[:4])
    assert "messages" not in got[4] and got[4]["detail_lost"]  # its block is lost, not invented
    path.write_bytes(whole[:-7] + b"\0" * 200)  # garbage after it
    assert [b.step for _, b in blocks(path)] == [0, 1, 2, 3]


def _damaged_run(tmp_path, steps=40):
    records = [{**_coded_record(), "step": t} for t in range(steps)]
    _write(tmp_path, records)
    return records, tmp_path / NAME


def test_a_damaged_block_loses_only_itself(tmp_path):
    """Before: one flipped byte at a third of a 40-step run's messages.bin left the detail of 13
    steps and said nothing; a copy cut at half, 20."""
    records, path = _damaged_run(tmp_path)
    whole = path.read_bytes()
    third = len(whole) // 3
    path.write_bytes(whole[:third] + bytes([whole[third] ^ 0xFF]) + whole[third + 1:])
    assert scan(tmp_path / "none") == ([], [])  # no file: nothing, no error
    found, damage = scan(path)
    assert len(found) == 39 and len(damage) == 1
    bad = next(t for t in range(40) if t not in {b.step for _, b in found})
    assert (damage[0].after, damage[0].before) == (bad - 1, bad + 1)
    with pytest.warns(DetailLostWarning) as caught:
        got = read_steps(tmp_path)
    text = str(caught[0].message)
    assert str(path) in text and f"(step {bad})" in text
    assert f"between the blocks of steps {bad - 1} and {bad + 1}" in text
    assert [r["step"] for r in got if r.get("detail_lost")] == [bad]
    for mine, record in zip(got, records):
        if mine["step"] != bad:
            _same(mine, record)


def test_a_copy_cut_at_half_keeps_its_first_half_and_says_which_steps_are_lost(tmp_path):
    records, path = _damaged_run(tmp_path)
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    with pytest.warns(DetailLostWarning, match=r"steps \d+-39"):
        got = read_steps(tmp_path)
    lost = [r["step"] for r in got if r.get("detail_lost")]
    assert lost == list(range(lost[0], 40)) and 19 <= lost[0] <= 21
    assert all("messages" in r for r in got[:lost[0]])


def test_a_resume_cuts_a_torn_last_block_and_says_so(tmp_path, caplog):
    _, path = _damaged_run(tmp_path, steps=10)
    path.write_bytes(path.read_bytes()[:-5])  # killed writing step 9's block
    with caplog.at_level("WARNING", logger="pgc_mpi"):
        _write(tmp_path, [{**_coded_record(), "step": t} for t in range(8, 12)], keep_steps_before=8)
    assert "cutting a partial last block (bytes" in caplog.text and "after the block of step 8" in caplog.text
    assert [b.step for _, b in blocks(path)] == list(range(12)) and scan(path)[1] == []


def test_a_resume_keeps_the_blocks_of_earlier_steps(tmp_path):
    first = [{**_coded_record(), "step": t} for t in range(10)]
    _write(tmp_path, first)
    path = tmp_path / NAME
    path.write_bytes(path.read_bytes()[:-5])  # and the job was killed writing step 9's block
    again = [{**_pbs_record(), "step": t} for t in range(6, 12)]  # the continuation, resumed at step 6
    _write(tmp_path, again, keep_steps_before=6)
    got = read_steps(tmp_path)
    assert [r["step"] for r in got] == list(range(12)) and [b.step for _, b in blocks(path)] == list(range(12))
    for mine, record in zip(got, first[:6] + again):
        _same(mine, record)
    _write(tmp_path, [{**_pbs_record(), "step": 0}], keep_steps_before=0)  # resumed at 0: nothing is kept
    assert [b.step for _, b in blocks(path)] == [0]


def test_step_records_in_json_do_not_grow_with_the_workers(tmp_path):
    from pgc_mpi.config import SimConfig
    from pgc_mpi.learning.problems import Logistic
    from pgc_mpi.sim.simulator import simulate

    sizes = {}
    for scheme in ("pgc-cr", "pbs"):
        for n in (50, 500):
            res = simulate(SimConfig(scheme=scheme, workers=n, stragglers=5, steps=6, delay="exp:1.0",
                                     compute_time=1.0, eval_every=100), Logistic(n, samples=4 * n, dim=4, batch_size=2))
            out = tmp_path / f"{scheme}-{n}"
            _write(out, res.records)
            lines = (out / "metrics.jsonl").read_text().splitlines()
            sizes[scheme, n] = (sum(map(len, lines)) / len(lines), (out / NAME).stat().st_size / len(lines),
                                sum(len(json.dumps(_plain(r))) for r in res.records) / len(lines))
    for scheme in ("pgc-cr", "pbs"):
        (small, _, _), (big, binary, before) = sizes[scheme, 50], sizes[scheme, 500]
        assert abs(big - small) < 40, sizes  # the same fields, a few more digits in the counts
        assert big < 640 and before > 40 * big, sizes  # was 60-140 bytes per worker (each line: 23 bytes of CRC)
        assert binary < 20 * 500 * (2 if scheme == "pbs" else 1), sizes  # a few bytes per message


def test_the_run_folder_knows_the_file():
    assert OUTPUTS[:2] == ("config.json", NAME)  # --overwrite clears it, a folder holding it holds a run


def _old_format(block: bytes, fmt: int) -> bytes:
    """A block as messages.bin's format `fmt` wrote it: format 3 before data_wait (the same block
    without its data_wait column), format 1 before turnaround too (without its turnaround column
    and its WHOLE flags, its CRC of the body only)."""
    import struct
    import zlib

    import numpy as np

    from pgc_mpi.runs.message_log import CHECKED, COLUMNS, HEADER, WHOLE

    magic, _, moved, c, step, rows, ages, _, _ = HEADER.unpack_from(block)
    data = bytearray(zlib.decompress(block[HEADER.size:]))
    at = 0
    for name, code in COLUMNS:
        size = np.dtype(code).itemsize * rows
        if name == "data_wait" or (name == "turnaround" and fmt == 1):
            del data[at:at + size]
            continue
        if name == "flags" and fmt == 1:
            data[at:at + size] = bytes(f & ~WHOLE for f in data[at:at + size])
        at += size
    body = zlib.compress(bytes(data))
    if fmt == 1:
        return HEADER.pack(magic, 1, moved, c, step, rows, ages, len(body), zlib.crc32(body)) + body
    head = HEADER.pack(magic, fmt, moved, c, step, rows, ages, len(body), 0)[:CHECKED]
    return head + struct.pack("<I", zlib.crc32(body, zlib.crc32(head))) + body


@pytest.mark.parametrize("fmt", [1, 3])
@pytest.mark.parametrize("record", [_coded_record(), _pbs_record()], ids=["coded", "pbs"])
def test_a_messages_bin_written_before_turnaround_or_data_wait_still_reads(tmp_path, record, fmt):
    """Format 1 blocks (pgc-mpi before turnaround was recorded) and format 3 blocks (before
    data_wait) read back with every other field as before and the missing ones None; a file may
    mix formats (a run resumed after an upgrade)."""
    _write(tmp_path, [record, {**record, "step": record["step"] + 1}])
    path = tmp_path / NAME
    (_, first), (_, second) = blocks(path)
    whole = path.read_bytes()
    cut = HEADER_SIZE + len(first.body)
    path.write_bytes(_old_format(whole[:cut], fmt) + whole[cut:])
    got = read_steps(tmp_path)
    assert [b.format for _, b in blocks(path)] == [fmt, FORMAT]
    kept = 7 if fmt == 1 else 8
    old = {**_json(record), "messages": [[*m[:kept], *[None] * (9 - kept)] for m in _json(record)["messages"]]}
    _same(got[0], old)
    _same(got[1], {**record, "step": record["step"] + 1})
    assert all(math.isnan(MessageRecord._make(m).data_wait or math.nan) for m in got[0]["messages"])
