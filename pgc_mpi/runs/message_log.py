"""OUT/messages.bin: the per-message detail of every step record, kept out of metrics.jsonl.

A step record as the master (or the simulator, or the ddp monitor) builds it holds lists that
grow with the number of workers: `messages` (one MessageRecord per message received),
`arrivals`, `used` and `rejected` (worker ids), `versions` (coded schemes: {worker: its
message's buffer versions}) and `ages` (pbs: one per partition): 75-140 kB of JSON per step at
1,000 workers. `MessageLog.write` takes them out of the record, appends them to messages.bin as
one compressed block, and returns the record for metrics.jsonl: its fixed-size fields, plus
`n_messages`, `n_arrivals` and `n_used`. `read_steps` puts them back.

The file is a sequence of blocks, one per step record, in step order. A block is a 32-byte
header (little-endian, `HEADER`): magic b"PGCm", format version (4), which of the record's keys
the block holds (bit i: `MOVED[i]`), c (buffer versions per message: each block says its own),
the record's step (int64), rows (its messages), ages (pbs: n; else 0), the length of the
compressed body and a CRC-32 of the block as a whole: the header's other 28 bytes, then the
body. Older blocks are still read: format 2's CRC covers the body only (a flipped header field
passes it, and is caught when the body does not decode to the sizes the header promises), and
format 1, written before turnaround was recorded, has no turnaround column (None); formats 1 to
3, written before data_wait was recorded, have no data_wait column (None). Then the body,
zlib-compressed (level `LEVEL`) columns one after the other, `rows` values each unless said
(`COLUMNS`; the layout's constants and the column encodings are in pgc_mpi.runs.message_columns):

- worker (int32), back (int32: the record's step minus the message's step);
- delay, compute_time, real_compute_time, turnaround (formats 2 to 4), data_wait (format 4): int64 nanoseconds
  (`NAN_NS` for NaN, `INF_NS` for infinity), byte-shuffled. Read back as seconds they are the
  original to the nanosecond, and exactly the original when it had at most 9 decimals (a
  --delay or --compute-time given in the flags). A trace replays delays
  (results.realized_delays): a nanosecond is far below what a sleep can tell apart, and
  float64's random low bits would make pbs's file half as large again (over 100 MB at 1,000
  workers and 5,000 steps). The turnaround column holds the nanoseconds the turnaround has
  beyond delay + compute_time (which it mostly is: the rest is the communication, a few bytes
  to store in a run and none in the simulator), or, in the rows flagged `WHOLE` (a delay or
  compute time that is not a finite time), the turnaround itself;
- gradients (int32), verdict (uint8: index in `VERDICTS`), flags (uint8: `ARRIVED`, `USED`,
  `REJECTED`, `WHOLE`);
- then the versions of the ARRIVED rows ([arrived, c] int32: the record's step minus each
  version) and the ages (int32).

The flags rebuild the lists exactly: `arrivals` are the workers of the ARRIVED rows in order (a
pbs worker once per message), `used` those of the USED rows, `rejected` (over --max-staleness)
those of the REJECTED rows, and `versions` maps the arrived workers, in arrival order, to their
versions. Where the same worker has two messages in a step that could each be the one listed,
the first is flagged: the lists come out the same. A list the flags could not express (never
seen: the collectors' lists are subsequences of their messages) stays in the JSON record.

Crash safety: a block is written in one write and flushed before its step's JSON line, so a
record always has its block; a killed job leaves at most one partial last block. Damage is
contained: the reader (`scan`) checks every block as a whole (magic, format, length, the CRC of
header and body), skips a bad one to the next intact block instead of dropping the rest of the
file, and a block that passes the checks but does not decode to exactly what its header says
(only an old format's header flip, or a CRC collision, one in 4 billion) counts as damaged
too, never raised. `with_messages` marks the step
records whose block is lost (`detail_lost`) and warns (DetailLostWarning) naming the file, the
steps and the damaged bytes. A resume cuts the file after the last block of a step before the
resume step, as MetricsWriter cuts metrics.jsonl, and says so when it cuts a partial last block.

`read_steps` returns the records as json.loads read them when metrics.jsonl held everything:
messages as lists in MessageRecord's order with None for NaN, versions keyed by strings.
"""

from __future__ import annotations

import logging
import math
import struct
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import WriteError, write_failure
from .message_columns import (
    ARRIVED,
    BIT,
    CHECKED,
    CODES,
    COLUMNS,
    COLUMNS_OF,
    FIELDS,
    FORMAT,
    FORMATS,
    HEADER,
    LEVEL,
    MAGIC,
    MOVED,
    REJECTED,
    TIMES,
    USED,
    VERDICTS,
    WHOLE,
    relative_turnaround,
    shuffle_bytes,
    to_nanoseconds,
    to_seconds,
    unshuffle_bytes,
)

NAME = "messages.bin"


def _match(workers: np.ndarray, candidates: list[np.ndarray], wanted: list) -> np.ndarray | None:
    """Rows whose workers spell `wanted` in order: the first candidate row set (a boolean mask)
    that does exactly, else the first rows of the last set that do (greedy); None if none do."""
    wanted = np.asarray(wanted, dtype=np.int64).reshape(-1)
    for mask in candidates:
        rows = np.flatnonzero(mask)
        if len(rows) == len(wanted) and np.array_equal(workers[rows], wanted):
            return rows
    found, k, end = [], 0, len(wanted)
    for i, worker in zip(rows.tolist(), workers[rows].tolist()):
        if k == end:
            break
        if worker == wanted[k]:
            found.append(i)
            k += 1
    return np.array(found, dtype=np.int64) if k == end else None


def pack(record: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
    """(the record without its per-message lists, the block holding them); (record, None) when it
    has no `messages`."""
    messages = record.get("messages")
    if messages is None:
        return record, None
    step, rows = int(record["step"]), len(messages)
    fields = list(zip(*messages)) or [()] * FIELDS
    if len(fields) != FIELDS:  # records written before real_compute_time, turnaround or data_wait existed
        fields = list(zip(*((*m, *[math.nan] * (FIELDS - len(m))) for m in messages)))
    workers = np.asarray(fields[0], dtype=np.int64)
    verdict = np.asarray(list(map(CODES.__getitem__, fields[5])), dtype=np.uint8)
    flags, arrived, moved = _flag_lists(record, workers, verdict)
    moved.add("messages")
    c, versions = 0, np.zeros(0, dtype=np.int64)
    if "versions" in record and arrived is not None:
        held = record["versions"]
        lengths = set(map(len, held.values()))
        c = lengths.pop() if len(lengths) == 1 else 0
        if list(map(int, held)) == workers[arrived].tolist() and (c or not held):
            versions = step - np.fromiter(chain.from_iterable(held.values()), dtype=np.int64, count=len(held) * c)
            moved.add("versions")
    ages = np.zeros(0, dtype=np.int64)
    if "ages" in record:
        ages = np.asarray(record["ages"], dtype=np.int64)
        moved.add("ages")
    delay, compute = to_nanoseconds(fields[2]), to_nanoseconds(fields[3])
    turnaround, whole = relative_turnaround(to_nanoseconds(fields[7]), delay, compute)
    flags[whole] |= WHOLE
    columns = {"worker": workers, "back": step - np.asarray(fields[1], dtype=np.int64), "delay": delay,
               "compute_time": compute, "real_compute_time": to_nanoseconds(fields[6]), "turnaround": turnaround,
               "data_wait": to_nanoseconds(fields[8]), "gradients": fields[4], "verdict": verdict, "flags": flags}
    parts = []
    for name, code in COLUMNS:
        column = np.asarray(columns[name]).astype(code, copy=False)
        parts.append(shuffle_bytes(column) if name in TIMES else column.tobytes())
    parts += [versions.astype("<i4").tobytes(), ages.astype("<i4").tobytes()]
    body = zlib.compress(b"".join(parts), LEVEL)
    bits = sum(BIT[key] for key in moved)
    head = HEADER.pack(MAGIC, FORMAT, bits, c, step, rows, len(ages), len(body), 0)[:CHECKED]
    header = head + struct.pack("<I", zlib.crc32(body, zlib.crc32(head)))
    slim = {k: v for k, v in record.items() if k not in moved}
    slim["n_messages"] = rows
    if "arrivals" in record:
        slim["n_arrivals"] = len(record["arrivals"])
    if "used" in record:
        slim["n_used"] = len(record["used"])
    return slim, header + body


def _flag_lists(record: dict[str, Any], workers: np.ndarray,
                verdict: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, set[str]]:
    """The rows' flags (REJECTED, ARRIVED, USED) that rebuild the record's `rejected`, `arrivals`
    and `used` lists, the ARRIVED rows in arrival order (None: no `arrivals`, or a list the flags
    cannot express), and the keys of the lists the flags rebuild (a list they cannot express
    stays in the record)."""
    stale = verdict == CODES["stale"]
    flags = np.zeros(len(workers), dtype=np.uint8)
    moved = set()
    if "rejected" in record:  # coded: exactly the stale messages; pbs: some of them
        found = _match(workers, [stale], record["rejected"])
        if found is not None:
            flags[found] |= REJECTED
            moved.add("rejected")
    arrived = None
    if "arrivals" in record:  # coded: the accepted messages (used or not); pbs: all but the rejected
        taken = (verdict == CODES["used"]) | (verdict == CODES["accepted"])
        arrived = _match(workers, [taken, (taken | stale) & (flags & REJECTED == 0)], record["arrivals"])
    if arrived is not None:
        flags[arrived] |= ARRIVED
        moved.add("arrivals")
        if "used" in record:  # coded: the messages verdict "used"; pbs: the arrivals
            found = _match(workers, [verdict == CODES["used"], flags & ARRIVED > 0], record["used"])
            if found is not None:
                flags[found] |= USED
                moved.add("used")
    return flags, arrived, moved


class BadBlock(ValueError):
    """A block whose checks passed but whose body does not decode to what its header says."""


@dataclass(frozen=True)
class Block:
    """One step's block as read: its header's fields and its compressed body."""

    moved: int
    c: int
    step: int
    rows: int
    ages: int
    body: bytes
    format: int = FORMAT

    def lists(self) -> dict[str, Any]:
        """The record's lists this block holds, in their JSON form. BadBlock when the body does not
        decode to exactly what the header says (sizes, verdict codes, keys): a damaged block."""
        try:
            data = zlib.decompress(self.body)
        except zlib.error as exc:
            raise BadBlock(f"the body does not decompress ({exc})") from None
        columns = COLUMNS_OF[self.format]
        fixed = self.rows * sum(np.dtype(code).itemsize for _, code in columns)
        if self.moved >> len(MOVED) or len(data) < fixed:
            raise BadBlock(f"{len(data)} bytes do not hold {self.rows} rows (or unknown keys {self.moved:#x})")
        at, cols = 0, {}
        for name, code in columns:
            dtype = np.dtype(code)
            chunk = data[at:at + dtype.itemsize * self.rows]
            cols[name] = unshuffle_bytes(chunk, dtype, self.rows) if name in TIMES else np.frombuffer(chunk, dtype)
            at += len(chunk)
        flags = cols["flags"]
        arrived = np.flatnonzero(flags & ARRIVED)
        held = len(arrived) * self.c if self.moved & BIT["versions"] else 0
        if len(data) != at + 4 * (held + self.ages) or (cols["verdict"] >= len(VERDICTS)).any():
            raise BadBlock(f"{len(data)} bytes are not the {at + 4 * (held + self.ages)} its header promises, "
                           f"or a verdict code is unknown")
        versions = np.frombuffer(data, "<i4", held, at).astype(np.int64)
        ages = np.frombuffer(data, "<i4", self.ages, at + 4 * held)
        workers = cols["worker"].tolist()
        out: dict[str, Any] = {}
        if self.moved & BIT["messages"]:
            steps = (self.step - cols["back"].astype(np.int64)).tolist()
            delay, compute, real = (to_seconds(cols[name]) for name in TIMES[:3])
            turnaround = [None] * self.rows  # format 1: not recorded
            if "turnaround" in cols:
                ns, relative = cols["turnaround"].copy(), flags & WHOLE == 0
                ns[relative] += cols["delay"][relative] + cols["compute_time"][relative]
                turnaround = to_seconds(ns)
            waits = to_seconds(cols["data_wait"]) if "data_wait" in cols else [None] * self.rows  # formats 1-3
            verdicts = [VERDICTS[v] for v in cols["verdict"].tolist()]
            out["messages"] = [list(m) for m in zip(workers, steps, delay, compute, cols["gradients"].tolist(),
                                                    verdicts, real, turnaround, waits)]
        for key, flag in (("arrivals", ARRIVED), ("used", USED), ("rejected", REJECTED)):
            if self.moved & BIT[key]:
                out[key] = [workers[i] for i in np.flatnonzero(flags & flag).tolist()]
        if self.moved & BIT["versions"]:
            table = (self.step - versions.reshape(len(arrived), self.c)).tolist()
            out["versions"] = {str(workers[i]): v for i, v in zip(arrived.tolist(), table)}
        if self.moved & BIT["ages"]:
            out["ages"] = ages.tolist()
        return out


@dataclass(frozen=True)
class Damage:
    """Bytes of a messages.bin that hold no whole block: [start, end) in the file, between the
    blocks of steps `after` and `before` (None: the file's start, or its end)."""

    start: int
    end: int
    after: int | None
    before: int | None

    def describe(self) -> str:
        where = (f"between the blocks of steps {self.after} and {self.before}" if self.after is not None and
                 self.before is not None else f"after the block of step {self.after}" if self.after is not None
                 else f"before the block of step {self.before}" if self.before is not None else "with no whole block")
        return f"bytes {self.start}..{self.end} {where}"


class DetailLostWarning(UserWarning):
    """A messages.bin lost some steps' per-message detail (damaged or cut short)."""


def _block_at(data: bytes, at: int) -> tuple[int, Block] | None:
    """(its end, the block) when a whole, intact block starts at `at`, else None."""
    if at + HEADER.size > len(data):
        return None
    magic, fmt, moved, c, step, rows, ages, length, crc = HEADER.unpack_from(data, at)
    body = data[at + HEADER.size:at + HEADER.size + length]
    if magic != MAGIC or fmt not in FORMATS or len(body) != length:
        return None
    # format 3 checks the header too: a flipped rows, c, step or key bit must not pass
    start = zlib.crc32(data[at:at + CHECKED]) if fmt >= 3 else 0
    if zlib.crc32(body, start) != crc:
        return None
    return at + HEADER.size + length, Block(moved, c, step, rows, ages, body, fmt)


def scan(path: Path) -> tuple[list[tuple[int, Block]], list[Damage]]:
    """The (offset of its end, block) of every whole block of a messages.bin, in file order, and the
    damaged stretches between them. A bad block (a flipped byte: its CRC; a cut: its length) costs
    only itself: the scan moves on to the next intact block, found by its magic bytes, header and
    CRC. A killed job's partial last block is a damaged stretch at the end (`before` None)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return [], []
    found, damage, at, bad_from = [], [], 0, None
    while at < len(data):
        whole = _block_at(data, at)
        if whole is None:
            if bad_from is None:
                bad_from = at
            nxt = data.find(MAGIC, at + 1)
            at = len(data) if nxt < 0 else nxt
            continue
        if bad_from is not None:
            damage.append(Damage(bad_from, at, found[-1][1].step if found else None, whole[1].step))
            bad_from = None
        found.append(whole)
        at = whole[0]
    if bad_from is not None:
        damage.append(Damage(bad_from, len(data), found[-1][1].step if found else None, None))
    return found, damage


def blocks(path: Path) -> Iterator[tuple[int, Block]]:
    """(offset of its end, block) of every whole block of a messages.bin, in file order (damaged
    stretches skipped: see scan). Nothing if there is no file."""
    yield from scan(path)[0]


class MessageLog:
    """The writer of OUT/messages.bin (see the module's docstring): `write(record)` appends the
    block of a step record and returns what to write to metrics.jsonl."""

    def __init__(self, out_dir: Path, keep_steps_before: int | None = None):
        """A new messages.bin, or, when resuming at step `keep_steps_before`, the existing one cut
        after its last whole block of an earlier step (the blocks of an abandoned continuation,
        or a killed job's partial block, go)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / NAME
        keep = 0
        if keep_steps_before is not None:
            found, damage = scan(self.path)
            keep = max((end for end, block in found if block.step < keep_steps_before), default=0)
            torn = [d for d in damage if d.before is None and d.start >= keep]
            if torn:  # a killed job's last write: cut as the resume cuts the abandoned blocks
                logging.getLogger("pgc_mpi").warning(
                    "%s: cutting a partial last block (%s, %d bytes) left by the job that stopped",
                    self.path, torn[0].describe(), torn[0].end - torn[0].start)
        try:
            if keep:
                with self.path.open("r+b") as fh:
                    fh.truncate(keep)
            self._fh: BinaryIO = self.path.open("ab" if keep else "wb")
        except OSError as exc:
            raise WriteError(write_failure(self.path, exc)) from None

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append (and flush) the block of a step record's per-message lists; returns the record
        without them. A record without `messages` is returned as it is."""
        slim, block = pack(record)
        if block is not None:
            try:
                self._fh.write(block)
                self._fh.flush()
            except OSError as exc:
                raise WriteError(write_failure(self.path, exc)) from None
        return slim

    def close(self) -> None:
        self._fh.close()


def with_messages(steps: list[dict[str, Any]], out_dir: Path) -> list[dict[str, Any]]:
    """Step records of OUT/metrics.jsonl with their lists from OUT/messages.bin put back (in place;
    returned). A list the record holds itself (written before messages.bin existed, or one the
    block could not express) stays. A record whose block is missing, does not decode, or does
    not match the record's counts (messages.bin damaged or cut) gets `"detail_lost": true`, and
    a DetailLostWarning names the file, the steps and the damaged bytes. Never raises for a
    damaged file."""
    wanted = {r["step"] for r in steps if "n_messages" in r and "messages" not in r}
    if not wanted:
        return steps
    path = Path(out_dir) / NAME
    found, damage = scan(path)
    by_step = {b.step: b for _, b in found if b.step in wanted}
    lost, undecoded = [], []
    for record in steps:
        block = by_step.get(record["step"])
        lists = _decoded(block, record) if block is not None and "messages" not in record else None
        if lists is not None:
            for key, value in lists.items():
                record.setdefault(key, value)
        elif record["step"] in wanted:
            record["detail_lost"] = True
            lost.append(record["step"])
            if block is not None:
                undecoded.append(record["step"])
    if lost:
        why = [d.describe() for d in damage] + \
            ([f"the blocks of {step_ranges(undecoded)} do not decode to their records"] if undecoded else [])
        why_text = "; damaged: " + ", ".join(why) if why else ("" if path.exists() else " (the file is missing)")
        warnings.warn(f"{path}: the per-message detail of {_count(lost, 'step')} is lost ({step_ranges(lost)})"
                      f"{why_text}", DetailLostWarning, stacklevel=2)
    return steps


def _decoded(block: Block, record: dict[str, Any]) -> dict[str, Any] | None:
    """The block's lists when it decodes and agrees with the record's counts, else None."""
    try:
        lists = block.lists()
    except BadBlock:
        return None
    counts = (("n_messages", "messages"), ("n_arrivals", "arrivals"), ("n_used", "used"))
    if any(count in record and key in lists and record[count] != len(lists[key]) for count, key in counts):
        return None
    return lists


def _count(items: list, noun: str) -> str:
    """'1 step', '3 steps'."""
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def step_ranges(steps: list[int]) -> str:
    """Steps as ranges: [3, 4, 5, 9] -> 'steps 3-5, 9'; [7] -> 'step 7'."""
    spans: list[list[int]] = []
    for step in sorted(steps):
        if spans and step == spans[-1][1] + 1:
            spans[-1][1] = step
        else:
            spans.append([step, step])
    word = "step " if len(spans) == 1 and spans[0][0] == spans[0][1] else "steps "
    return word + ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)
