"""The MPI tags: one table (pgc_mpi.runtime.tags), no two kinds of message on one tag, and no module
of pgc_mpi defines a tag of its own outside it."""

from __future__ import annotations

import re
from pathlib import Path

from pgc_mpi.runtime import tags

PKG = Path(tags.__file__).resolve().parents[1]


def test_every_tag_is_its_own():
    values = list(tags.TAGS.values())
    assert len(values) == len(set(values)), {v: [n for n, w in tags.TAGS.items() if w == v]
                                             for v in values if values.count(v) > 1}
    assert all(isinstance(v, int) and 0 <= v < 32768 for v in values)  # MPI_TAG_UB is at least 32767


def test_the_table_names_every_tag():
    assert set(tags.TAGS) == {name for name in vars(tags) if name.startswith("TAG_")}
    assert len(tags.TAGS) == 18


def test_no_module_defines_a_tag_outside_the_table():
    defining = re.compile(r"^\s*TAG_\w+(\s*,\s*TAG_\w+)*\s*=", re.MULTILINE)
    found = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
             if p.name != "tags.py" and defining.search(p.read_text())]
    assert not found, f"tags defined outside pgc_mpi/runtime/tags.py: {found}"
