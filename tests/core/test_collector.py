"""The collectors (pgc_mpi.core.collector): one interface for coded schemes and pbs, no clock, no MPI."""

from __future__ import annotations

import numpy as np
import pytest

from pgc_mpi.core.collector import CodedCollector, DeadlineMissed, TableCollector, make_collector
from pgc_mpi.core.message import Message
from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.errors import NotDecodable


def _msg(step, worker, versions, **kw):
    return Message(step, worker, tuple(versions), **kw)


def test_a_streaming_decoder_sums_as_messages_arrive_and_scales_once():
    scheme = make_scheme("pgc-cr", 4, 1)
    grad = np.zeros(3)
    col = make_collector(scheme, grad)
    assert isinstance(col, CodedCollector) and not col.answers_every_message
    col.begin(2)
    for i in (0, 1, 2):
        assert col.offer(_msg(2, i, [2, 1], loss=float(i)), np.full(3, i + 1.0)) == "accepted"
        assert not col.held  # streamed into grad: the buffer may be reused at once
    assert col.ready()
    dec = col.decode()
    np.testing.assert_allclose(grad, np.full(3, (1 + 2 + 3) / 6))  # 1/(|F| c), as the worked example
    rec = col.record(dec, missed=False)
    assert rec["used"] == [0, 1, 2] and rec["train_loss"] == pytest.approx(1.0)
    assert [m.verdict for m in rec["messages"]] == ["used"] * 3 and rec["versions"][0] == [2, 1]


def test_a_linear_decoder_holds_payloads_until_the_decode():
    scheme = make_scheme("gc-cr", 3, 1, seed=0)
    grad = np.zeros(2)
    col = make_collector(scheme, grad)
    col.begin(0)
    payloads = {0: np.array([1.0, 0.0]), 2: np.array([0.0, 1.0])}
    for i, p in payloads.items():
        col.offer(_msg(0, i, [0, 0]), p)
    assert set(col.held) == {0, 2}
    dec = col.decode()
    a = scheme.decode_weights([0, 2])
    np.testing.assert_allclose(grad, a[0] * payloads[0] + a[2] * payloads[2])
    assert dec.residual < 1e-9


def test_verdicts_late_future_duplicate_stale():
    col = make_collector(make_scheme("pgc-cr", 4, 1), np.zeros(1), max_staleness=1)
    col.begin(5)
    assert col.offer(_msg(4, 0, [4, 3]), np.ones(1)) == "late"
    assert col.offer(_msg(6, 0, [6, 5]), np.ones(1)) == "future"
    assert col.offer(_msg(5, 1, [5, 2]), np.ones(1)) == "stale"  # oldest buffer 3 steps old
    assert col.offer(_msg(5, 2, [5, 4]), np.ones(1)) == "accepted"
    assert col.offer(_msg(5, 2, [5, 4]), np.ones(1)) == "duplicate"
    assert col.late == 1 and col.rejected == [1] and col.arrived == [2]
    assert col.waiting_for() == [0, 1, 3]


def test_deadline_policies_are_the_same_for_both_kinds():
    coded = make_collector(make_scheme("dgd", 3, 0), np.zeros(1))
    table = make_collector(make_scheme("pbs", 3, 1), np.zeros(1))
    for col in (coded, table):
        col.begin(0)
        assert col.on_deadline("wait") is None
        with pytest.raises(DeadlineMissed):
            col.on_deadline("fail")
    assert coded.on_deadline("partial") is None  # nothing arrived: nothing to decode
    assert table.on_deadline("partial") is None  # nothing new: never the previous aggregate again
    table.offer(_msg(0, 0, [0], partition=0), np.ones(1))
    dec = table.on_deadline("partial")  # the table decodes what it holds: 2 of 3 entries empty
    assert dec.partial and dec.residual == pytest.approx(np.sqrt(2) / 3)


def test_the_table_steps_when_fresh_and_records_ages():
    scheme = make_scheme("pbs", 3, 1)
    grad = np.zeros(2)
    col = make_collector(scheme, grad, max_staleness=2)
    assert isinstance(col, TableCollector) and col.answers_every_message
    col.begin(0)
    with pytest.raises(NotDecodable):
        col.decode()
    for j in range(3):
        assert col.offer(_msg(0, j, [0], partition=j, loss=1.0), np.full(2, j + 1.0)) == "used"
    assert col.ready() and not col.held  # the table copies: buffers are free at once
    dec = col.decode()
    np.testing.assert_allclose(grad, [2.0, 2.0])
    assert dec.used == [0, 1, 2] and dec.max_staleness == 0 and dec.weights is None
    assert col.record(dec, missed=False)["new_gradients"] == 3
    col.begin(1)
    assert col.offer(_msg(0, 2, [0], partition=2), np.ones(2)) == "stale"  # not newer than the entry
    assert not col.ready()  # the table is fresh, but a step would re-apply the previous mean
    assert col.offer(_msg(1, 2, [1], partition=2), np.ones(2)) == "used" and col.ready()
    col.begin(3)
    assert not col.ready()  # no message yet this step, and the entries are too old
    assert col.offer(_msg(0, 1, [0], partition=1), np.ones(2)) == "stale"  # 3 steps old > 2
    assert col.offer(_msg(2, 9, [2], partition=1), np.ones(2)) == "unknown"
    rec = col.record(dec, missed=True)
    assert rec["ages"] == [3, 3, 2] and rec["deadline_missed"] and rec["rejected"] == [1]
