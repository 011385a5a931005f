"""python -m pgc_mpi.commands.restart_count, as launch/local.sh and launch/slurm/train.sbatch call it
after losses: the count on its first line, why fewer on its second; status 1 and one line when no
count fits; pgc-train's parser for the options after --; no torch or mpi4py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pgc_mpi.commands.restart_count import main


def run(capsys, *argv: str) -> tuple[int, list[str]]:
    status = main(list(argv))
    return status, capsys.readouterr().out.splitlines()


def test_workers_or_ranks_and_why_fewer(capsys):
    status, lines = run(capsys, "--available", "3", "--", "--scheme", "pgc-fr", "-s", "1")
    assert status == 0 and lines[0] == "2" and len(lines) == 2
    assert lines[1].startswith("3 workers left, and pgc-fr with s = 1 does not run on 3 (")
    assert lines[1].endswith("starting it again on 2, leaving 1 out")
    # train.sbatch's question: ranks left, the --servers among them (2 + 3 workers: 2 + 2 ranks)
    status, lines = run(capsys, "--ranks", "5", "--", "--scheme", "pgc-fr", "-s", "1", "--servers", "2")
    assert status == 0 and lines[0] == "4" and "3 workers left" in lines[1]
    status, lines = run(capsys, "--ranks", "4", "--", "--scheme", "gc-cr", "-s", "2")  # all 3 workers fit
    assert (status, lines) == (0, ["4"])


def test_no_count_is_one_line_of_why_and_what_to_run_instead(capsys):
    status, lines = run(capsys, "--ranks", "3", "--", "--scheme", "gc-cr", "-s", "2", "--out", "runs/a",
                        "--no-overwrite", "--resume", "auto")
    assert status == 1 and len(lines) == 1
    assert lines[0].startswith("2 workers left and gc-cr with s = 2 runs on none of 1..2 (on 2: s must be smaller")
    assert lines[0].endswith("resume it on 3 workers (4 ranks), the fewest above 2 that it runs on: the same "
                             "options with --resume auto --out runs/a")


def test_options_pgc_train_refuses_are_its_errors_with_status_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["--available", "3", "--", "--no-such-option"])
    assert exc.value.code == 2 and "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    status = main(["--available", "3", "--", "--config", str(tmp_path / "missing.toml")])
    assert status == 2 and "--config" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--", "--scheme", "dgd"])  # how many are left is not optional
    assert exc.value.code == 2


def test_the_command_runs_fast_without_torch_or_mpi4py(tmp_path):
    command = subprocess.run([sys.executable, "-m", "pgc_mpi.commands.restart_count", "--available", "3", "--",
                              "--scheme", "pgc-fr", "-s", "1"], capture_output=True, text=True, timeout=60)
    assert command.returncode == 0 and command.stdout.splitlines()[0] == "2", command.stderr
    code = ("import sys; from pgc_mpi.commands.restart_count import main; main(['--available', '3', '--']); "
            "print(sorted({'torch', 'mpi4py', 'h5py'} & set(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0 and loaded.stdout.splitlines()[-1] == "[]", loaded.stdout + loaded.stderr
