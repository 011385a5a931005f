"""What an install brings and what a command says when an optional part is missing: the MPI
library ([mpich] extra or a site MPI), matplotlib ([plot]) and the MPI launcher."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pgc_mpi.commands import plot
from pgc_mpi.commands.bench import main as bench
from pgc_mpi.config import tomllib
from pgc_mpi.job import entry

ROOT = Path(__file__).resolve().parents[2]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip() for r in requirements}


def test_optional_parts_are_extras():
    project = _project()
    core, extras = _names(project["dependencies"]), project["optional-dependencies"]
    assert {"mpi4py", "numpy", "h5py", "torch", "scikit-learn"} <= core  # scikit-learn: the default data set
    assert not core & {"mpich", "matplotlib", "pytest"}
    assert _names(extras["mpich"]) == {"mpich"}
    assert _names(extras["plot"]) == {"matplotlib"}
    assert _names(extras["tensorboard"]) == {"tensorboard"}
    assert "pytest" in _names(extras["test"])


def test_ci_installs_every_extra_the_tests_need():
    assert "-e '.[test,mpich,plot,tensorboard]'" in (ROOT / ".ci" / "run").read_text()


def test_mpi_library_found_here():
    assert entry.mpi_loads()


def test_pgc_train_without_an_mpi_library_says_so_in_one_line():
    code = "import pgc_mpi.job.entry as e; e.mpi_loads = lambda: False; e.train()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [entry.MPI_MISSING]
    assert "pip install 'pgc-mpi[mpich]'" in done.stderr


def test_pgc_plot_without_matplotlib_says_so_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(plot, "have_matplotlib", lambda: False)
    assert plot.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == ["pgc-plot needs matplotlib: pip install 'pgc-mpi[plot]'"]


def test_pgc_bench_without_its_launcher_says_so_before_any_run(tmp_path, capsys):
    exp = tmp_path / "exp.toml"
    exp.write_text('workers = 2\nschemes = ["dgd"]\nlauncher = "no-such-mpiexec -n {ranks}"\n[train]\nsteps = 2\n')
    assert bench([str(exp), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("pgc-bench: error: ") and "no-such-mpiexec" in err[0]
    assert not (tmp_path / "out" / "dgd-s1-seed0").exists()
