"""The message layout (pgc_mpi.core.message): named header fields, byte layout, per-message records."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pgc_mpi.core.message import GRADIENT_FIELDS, MODEL_HEADER, Layout, Message, MessageRecord, gradient_header
from pgc_mpi.core.schemes import make_scheme


def test_a_message_survives_its_bytes():
    layout = Layout(gradient_header(3), dim=5, dtype=np.float32)
    buf = layout.allocate()[0]
    header, payload = layout.split(buf)
    sent = Message(7, 2, (5, 6, 7), partition=-1, loss=0.25, compute_time=0.5, delay=1.5, gradients=1,
                   real_compute_time=0.125, data_wait=0.0625)
    sent.write(header)
    payload[:] = np.arange(5)
    copy = buf.copy()  # what the receiver's buffer holds after MPI moved the bytes
    h2, p2 = layout.split(copy)
    assert Message.read(h2) == sent
    np.testing.assert_array_equal(p2, np.arange(5, dtype=np.float32))
    assert layout.nbytes == 8 * (len(GRADIENT_FIELDS) + 3) + 5 * 4 == buf.nbytes


def test_header_views_write_in_place_by_name():
    layout = Layout(MODEL_HEADER, dim=2, dtype=np.float64)
    buf = layout.allocate()[0]
    header, _ = layout.split(buf)
    header["step"] = 41
    assert int(layout.split(buf)[0]["step"]) == 41


@pytest.mark.parametrize("name,versions", [("pgc-cr", 3), ("gc-fr", 3), ("dgd", 1), ("pbs", 1)])
def test_every_scheme_s_message_carries_its_buffer_versions(name, versions):
    from pgc_mpi.core.message import buffers_per_message

    assert buffers_per_message(make_scheme(name, 6, 2)) == versions


def test_a_record_is_a_json_list_read_back_by_name():
    rec = Message(3, 1, (2, 3), compute_time=0.1, delay=0.2, gradients=1, real_compute_time=0.05,
                  turnaround=0.35, data_wait=0.01).record("used")
    again = MessageRecord._make(json.loads(json.dumps(rec)))
    assert again == rec and again.verdict == "used" and again.delay == 0.2 and again.turnaround == 0.35
    assert again.data_wait == 0.01
    bad = MessageRecord.rejected(4)
    assert bad.worker == 4 and bad.step == -1 and math.isnan(bad.delay) and bad.verdict == "rejected"


def test_records_written_before_turnaround_real_compute_time_or_data_wait_read_with_nan():
    for old in ([3, 7, 0.1, 0.2, 1, "used"], [3, 7, 0.1, 0.2, 1, "used", 0.15],
                [3, 7, 0.1, 0.2, 1, "used", 0.15, 0.4]):
        rec = MessageRecord._make(old)
        assert rec[:len(old)] == tuple(old) and math.isnan(rec.data_wait)
        assert math.isnan(rec.turnaround) == (len(old) < 8)
    assert MessageRecord(3, 7, 0.1, 0.2, 1, "used").turnaround != 0  # nan: unknown
    assert Message(3, 1, (3,)).record("used")[-1] != Message(3, 1, (3,)).record("used")[-1]  # nan by default
