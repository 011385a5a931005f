"""The traits table (pgc_mpi.core.traits): one row per scheme, and the rows agree with the schemes."""

from __future__ import annotations

import pytest

from pgc_mpi.core.schemes import PbsScheme, make_scheme
from pgc_mpi.core.traits import PEER_SCHEMES, S_FREE, SCHEME_NAMES, TRAITS, Traits, schemes_with, traits


def test_every_scheme_has_one_row_and_the_views_come_from_it():
    assert set(TRAITS) == set(SCHEME_NAMES) | set(PEER_SCHEMES) and not set(SCHEME_NAMES) & set(PEER_SCHEMES)
    assert SCHEME_NAMES == ("dgd", "is-sgd", "gc-fr", "gc-cr", "is-gc-fr", "is-gc-cr", "pgc-fr", "pgc-cr", "pbs")
    assert PEER_SCHEMES == ("ddp",) and set(S_FREE) == {"dgd", "pbs", "ddp"}
    assert all(isinstance(row, Traits) and row.name == name for name, row in TRAITS.items())


@pytest.mark.parametrize("name", list(TRAITS))
def test_the_traits_never_contradict_each_other(name):
    t = traits(name)
    assert not (t.abandons and t.drops_compute)  # --abandon-late and --drop-compute never meet
    assert not t.waits_for_all or (not t.depends_on_s and not t.abandons)  # nothing is moot when all are awaited
    assert not t.table or t.pipelined
    assert t.simulated != t.peer


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_the_rows_say_what_the_built_schemes_do(name):
    scheme = make_scheme(name, 6, 2)
    t = traits(name)
    assert isinstance(scheme, PbsScheme) == t.table
    assert scheme.pipelined == t.pipelined
    if not t.table:
        assert scheme.min_arrivals == (6 if t.waits_for_all else 4)
    if t.sets_c:  # partitions per worker, or pbs's window
        chosen = make_scheme(name, 6, 1, c=3)
        assert (chosen.table_window if t.table else chosen.c) == 3
    else:
        with pytest.raises(ValueError, match="c applies only to"):
            make_scheme(name, 6, 1, c=3)
    assert not t.depends_on_s or make_scheme(name, 6, 1).s == 1


def test_schemes_with_a_trait_lists_them_in_the_tables_order():
    assert schemes_with("drops_compute") == ("dgd", "ddp")
    assert schemes_with("table") == ("pbs",)
    assert "pgc-fr" in schemes_with("abandons") and "dgd" not in schemes_with("abandons")
