"""The public API: what pgc_mpi exports, and that importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import pgc_mpi


def test_every_exported_name_resolves():
    for name in pgc_mpi.__all__:
        assert getattr(pgc_mpi, name) is not None, name
    assert sorted(dir(pgc_mpi)) == sorted(pgc_mpi.__all__)


def test_importing_the_package_does_not_import_torch():
    code = "import sys, pgc_mpi; pgc_mpi.make_scheme('pgc-cr', 4, 1); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
