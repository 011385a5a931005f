"""The pbs study: every configuration on paired seeds, its table and its paired tests."""

from __future__ import annotations

import json

from pgc_mpi.sim.pbs_study import main


def test_a_small_study_prints_the_table_and_the_paired_tests(tmp_path, capsys):
    out = tmp_path / "runs.jsonl"
    assert main(["--seeds", "2", "--steps", "40", "--samples", "400", "--dim", "10", "--windows", "2,4",
                 "--target-val-loss", "0.5", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for label in ("dgd", "gc-cr", "pbs R=2 C=2", "pbs R=2 C=4"):
        assert any(line.startswith(label) for line in text.splitlines()), label
    assert "pbs R=2 C=4 vs gc-cr: wins-losses" in text and "p=" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8 and {r["seed"] for r in rows} == {0, 1}
    pbs = [r for r in rows if r["scheme"] == "pbs R=2 C=4"]
    assert all(r["max_age"] <= 3 and r["gradients"] > 0 for r in pbs)


def test_bad_windows_are_refused(capsys):
    assert main(["--windows", "2,0"]) == 2
    assert "must be positive" in capsys.readouterr().err
