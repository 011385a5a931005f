"""The readers of a run on a real pgc-train run folder that was damaged afterwards (a flipped byte in
messages.bin and in metrics.jsonl, a garbled config.json): pgc-advise, pgc-plot and the trace
replay answer from what is intact with a warning, or say in one line what is wrong and exit 2;
never a traceback."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
from test_advise import train_probe

from pgc_mpi.commands import advise, plot
from pgc_mpi.runs.message_log import NAME, DetailLostWarning, blocks
from pgc_mpi.runs.metrics import DamagedLinesWarning
from pgc_mpi.runs.results import read_steps, realized_delays


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return train_probe(tmp_path_factory.mktemp("damaged") / "probe")


@pytest.fixture
def damaged(probe, tmp_path):
    """A copy of the probe with step 20's messages.bin block header and step 30's metrics line flipped."""
    run = tmp_path / "probe"
    shutil.copytree(probe, run)
    data = bytearray((run / NAME).read_bytes())
    start = next(end for end, block in blocks(run / NAME) if block.step == 19)  # where step 20's block begins
    data[start + 16] ^= 0x01  # its rows field: the old format's CRC (of the body only) would have passed this
    (run / NAME).write_bytes(bytes(data))
    lines = (run / "metrics.jsonl").read_bytes().split(b"\n")
    at = next(i for i, line in enumerate(lines) if line.startswith(b'{"step": 30,'))
    lines[at] = lines[at].replace(b'"step_time": 0.', b'"step_time": 9.', 1)  # still JSON: only its CRC tells
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines))
    return run


def test_the_damage_is_named_and_the_rest_reads(damaged):
    with pytest.warns(DetailLostWarning, match=r"\(step 20\)") as caught, \
            pytest.warns(DamagedLinesWarning, match="step 30 missing"):
        steps = read_steps(damaged)
    assert len(caught) >= 1
    assert 30 not in [r["step"] for r in steps] and len(steps) == 49
    assert [r["step"] for r in steps if r.get("detail_lost")] == [20]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = realized_delays(damaged)  # what a replay of the run's delays takes
    assert trace and not {step for _, step, _ in trace} & {20, 30}


def test_advise_and_plot_answer_from_what_is_intact(damaged, capsys, tmp_path):
    argv = [str(damaged), "--target-loss", "0.005", "--schemes", "dgd,pgc-cr", "--s", "1", "--seeds", "1", "--json"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert advise.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["candidates"]
    pytest.importorskip("matplotlib")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert plot.main([str(damaged), "--out", str(tmp_path / "figures")]) == 0
    err = capsys.readouterr().err
    assert "lost" in err and "Traceback" not in err
    assert list((tmp_path / "figures").glob("*.png"))


@pytest.mark.parametrize("config", [b"", b'{"config": {"scheme": "dg', b"\x00" * 40])
def test_a_damaged_config_json_is_one_line_and_exit_2(damaged, capsys, tmp_path, config):
    (damaged / "config.json").write_bytes(config)
    assert advise.main([str(damaged), "--target-loss", "0.005"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json" in err and "damaged" in err
    if plot.have_matplotlib():
        assert plot.main([str(damaged), "--out", str(tmp_path / "figures")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "config.json" in err and "damaged" in err
