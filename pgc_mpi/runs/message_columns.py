"""How a block of OUT/messages.bin is laid out: its header, its columns, and how a column's values
become bytes and back (times as int64 nanoseconds, byte-shuffled so that zlib finds the repeats).

The file, its blocks and what they rebuild are described in pgc_mpi.runs.message_log, which writes
them (`pack`) and reads them (`Block.lists`) with these.
"""

from __future__ import annotations

import struct

import numpy as np

from ..core.message import MessageRecord

MAGIC = b"PGCm"
FORMAT = 4
# the block formats the reader takes: 1 has no turnaround column, 1 to 3 no data_wait; 1 and 2 check the body only
FORMATS = (1, 2, 3, 4)
# magic, format, moved keys (bits), c, step, rows, ages, compressed length, CRC-32 (format 3: of the
# header's first 28 bytes and the compressed body; 1 and 2: of the compressed body)
HEADER = struct.Struct("<4sBBHqIIII")
CHECKED = HEADER.size - 4  # the header's bytes before its CRC: format 3's CRC covers them
LEVEL = 1  # zlib level: levels 6 and 9 save under 2 % on these columns, at several times the time
MOVED = ("messages", "arrivals", "used", "rejected", "versions", "ages")  # bit i of the header's field
VERDICTS = ("used", "accepted", "late", "stale", "rejected")  # MessageRecord.verdict, by code
ARRIVED, USED, REJECTED, WHOLE = 1, 2, 4, 8  # row flags (WHOLE: the turnaround column holds it whole)
COLUMNS = (("worker", "<i4"), ("back", "<i4"), ("delay", "<i8"), ("compute_time", "<i8"),
           ("real_compute_time", "<i8"), ("turnaround", "<i8"), ("data_wait", "<i8"), ("gradients", "<i4"),
           ("verdict", "u1"), ("flags", "u1"))
_BEFORE_DATA_WAIT = tuple(c for c in COLUMNS if c[0] != "data_wait")
COLUMNS_OF = {4: COLUMNS, 3: _BEFORE_DATA_WAIT, 2: _BEFORE_DATA_WAIT,  # by block format
              1: tuple(c for c in _BEFORE_DATA_WAIT if c[0] != "turnaround")}
TIMES = ("delay", "compute_time", "real_compute_time", "turnaround", "data_wait")  # nanoseconds, byte-shuffled
FIELDS = len(MessageRecord._fields)  # a message's JSON list: MessageRecord's fields in order
NAN_NS, INF_NS = np.iinfo(np.int64).min, np.iinfo(np.int64).max
CODES = {verdict: code for code, verdict in enumerate(VERDICTS)}
BIT = {key: 1 << i for i, key in enumerate(MOVED)}


def to_nanoseconds(seconds) -> np.ndarray:
    """Seconds as int64 nanoseconds, rounded to the nearest: NAN_NS for NaN, INF_NS for +infinity
    (and times beyond 285 years), NAN_NS + 1 for -infinity."""
    x = np.asarray(seconds, dtype=np.float64)
    finite = np.isfinite(x) & (np.abs(x) < 9e9)  # 285 years: beyond, a time is as good as infinite
    out = np.where(np.isnan(x), NAN_NS, np.where(x > 0, INF_NS, NAN_NS + 1)).astype(np.int64)
    out[finite] = np.rint(x[finite] * 1e9).astype(np.int64)
    return out


def to_seconds(ns: np.ndarray) -> list[float | None]:
    """Nanoseconds as json.loads gives back seconds: floats, None for NaN and infinities."""
    values = (ns / 1e9).tolist()
    special = np.flatnonzero((ns == NAN_NS) | (ns == INF_NS) | (ns == NAN_NS + 1))
    for i in special.tolist():
        values[i] = None
    return values


def relative_turnaround(turnaround: np.ndarray, delay: np.ndarray,
                        compute: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the turnaround column, its WHOLE rows): nanoseconds beyond delay + compute_time where all
    three are finite times (small enough not to overflow), the turnaround itself elsewhere."""
    def small(ns: np.ndarray) -> np.ndarray:
        return (ns > -2**61) & (ns < 2**61)  # excludes NAN_NS, INF_NS and NAN_NS + 1

    relative = small(turnaround) & small(delay) & small(compute)
    column = turnaround.copy()
    column[relative] -= delay[relative] + compute[relative]
    return column, ~relative


def shuffle_bytes(column: np.ndarray) -> bytes:
    """The column's bytes, byte 0 of every value first, then byte 1...: zlib finds the repeats."""
    return column.view(np.uint8).reshape(-1, column.itemsize).T.tobytes()


def unshuffle_bytes(data: bytes, dtype: np.dtype, rows: int) -> np.ndarray:
    """The `rows` values of `dtype` that shuffle_bytes wrote as `data`."""
    return np.frombuffer(data, np.uint8).reshape(dtype.itemsize, rows).T.copy().view(dtype).reshape(rows)
