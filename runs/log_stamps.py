"""When each line of a job's log was written: the server's copy of the runner's output.times.

The runner stamps each part of a job's output with its host's clock as it receives it
(runner/log_times.py); the engine copies the stamps with the bytes (engine/log_copy.py) into
LOG_DIR/<project id>/<job uuid>.times, in the same fixed-width records. A host may be hostile or
its clock wrong: stamps outside the bytes copied, out of order, before the last one kept or later
than the server's clock are dropped or clamped, never a reason to fail a copy. Bytes with no stamp
from their host (a runner from before output.times) get the time the server copied them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from django.conf import settings

from runner.log_times import RECORD, Record, first_at_or_after, pack, unpack
from runs.log_storage import stored_path
from runs.models import Job


def times_path(job: Job) -> Path:
    return stored_path(job).with_suffix(".times")


def _cap() -> int:
    """Bytes of stamps kept of one job: a quarter of the log's copy limit (then lines take the last one)."""
    return max(int(settings.MUSTER["LOG_COPY_LIMIT"]) // 4, 64 * RECORD.size)


def last_of(path: Path) -> Record | None:
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size // RECORD.size * RECORD.size
            if not size:
                return None
            f.seek(size - RECORD.size)
            return RECORD.unpack(f.read(RECORD.size))
    except FileNotFoundError:
        return None


def checked(records: list[Record], start: int, end: int, last: Record | None, now_ms: int,
            earliest: int = 0) -> list[Record]:
    """The stamps worth keeping of the bytes [start, end), copied after the stamp `last`; `records`
    are the host's, from the one in force at `start` (runner/log_times.py: records_between)."""
    if end <= start or last is not None and last[0] >= start:
        return []
    in_force = [ms for offset, ms in records if offset <= start][-1:]
    rest: list[Record] = []
    for offset, ms in records:
        if start < offset < end and (not rest or offset > rest[-1][0]):
            rest.append((offset, ms))  # out of order: left out
    if not in_force and not rest:
        in_force = [now_ms]  # no stamps from the host: when the server copied them
    kept: list[Record] = []
    floor = last[1] if last else min(earliest, now_ms)
    for offset, ms in [(start, (in_force or [rest[0][1]])[0]), *rest]:
        ms = min(max(ms, floor), now_ms)  # never before the line above, never in the future
        if ms != (kept[-1][1] if kept else last[1] if last else None):
            kept.append((offset, ms))
        floor = ms
    return kept


def append(job: Job, start: int, data: bytes, records: list[Record]) -> None:
    """Keep the stamps of `data`, just appended to the job's copy at `start` (its lock held)."""
    path = times_path(job)
    last = last_of(path)
    # no time before the job started (its runner's clock, as the stamps): a job writing its own
    # stamps cannot put its lines before every other job's
    try:
        earliest = int(job.start_time * 1000) if job.start_time else 0
    except (TypeError, ValueError, OverflowError):
        earliest = 0
    kept = checked(records, start, start + len(data), last, int(time.time() * 1000), earliest)
    if not kept:
        return
    # as private as the log itself (0600)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
        # a stamp per chunk a host says it received: a host sending one per byte would make them 16
        # times the log, so past a small allowance they stay within a quarter of the log's bytes
        allowed = min(_cap(), (start + len(data)) // 4 + 64 * RECORD.size)
        room = allowed - os.fstat(out.fileno()).st_size
        out.write(pack(kept)[:max(0, room) // RECORD.size * RECORD.size])


def line_times(job: Job, start: int, data: bytes) -> list[list[int]] | None:
    """The time (epoch ms) of each line that begins in `data` (the log's bytes from `start`), as
    [time, lines] runs; None when the copy has no stamps (a copy from before them)."""
    times = times_at(job, start, data, _line_starts(job, start, data))
    if times is None:
        return None
    runs: list[list[int]] = []
    for ms in times:
        if runs and runs[-1][0] == ms:
            runs[-1][1] += 1
        else:
            runs.append([ms, 1])
    return runs


def times_at(job: Job, start: int, data: bytes, positions: list[int]) -> list[int] | None:
    """The stamp in force at each of `positions` (in order, within the bytes `data` read from
    `start`): when the runner received the byte there; None without stamps."""
    path = times_path(job)
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return None
    with f:
        count = os.fstat(f.fileno()).st_size // RECORD.size
        index = max(0, first_at_or_after(f, count, start + 1) - 1)  # the stamp in force at `start`
        end = first_at_or_after(f, count, start + len(data))
        f.seek(index * RECORD.size)
        records = unpack(f.read((end - index + 1) * RECORD.size))
    if not records:
        return None
    times, at = [], 0
    for position in positions:
        while at + 1 < len(records) and records[at + 1][0] <= position:
            at += 1
        times.append(records[at][1])
    return times


def _line_starts(job: Job, start: int, data: bytes) -> list[int]:
    starts = []
    if data and (start == 0 or _byte_before(job, start) == b"\n"):
        starts.append(start)
    at = data.find(b"\n")
    while at != -1 and at + 1 < len(data):
        starts.append(start + at + 1)
        at = data.find(b"\n", at + 1)
    return starts


def _byte_before(job: Job, start: int) -> bytes:
    try:
        with stored_path(job).open("rb") as f:
            f.seek(start - 1)
            return f.read(1)
    except OSError:
        return b""
