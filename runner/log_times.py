"""output.times: when the runner received each part of a job's output, next to output.log.

One fixed-width record per chunk the runner's pump read from the job (runner/output_log.py): the
byte offset in output.log where the chunk begins and the host's clock then, in epoch milliseconds.
A line's time is that of the last record at or before its first byte. Records are at least GRAIN_MS
apart (a job printing a byte at a time must not make the file grow with every byte), and the file
counts against the job's log limit together with output.log.

The server keeps the same records next to its copy of the log (runs/log_storage.py); `framed` is
what the `log --times` verb answers: one header line, the log bytes, then the records of them.
"""

from __future__ import annotations

import os
import stat
import struct
from typing import Tuple

RECORD = struct.Struct(">QQ")  # offset, epoch ms
GRAIN_MS = 10
MAX_RECORDS = 4096  # of one `log --times` answer: its bytes are cut where the next record begins

Record = Tuple[int, int]


def pack(records: list[Record]) -> bytes:
    return b"".join(RECORD.pack(offset, ms) for offset, ms in records)


def unpack(data: bytes) -> list[Record]:
    """The whole records in `data` (a torn last one is left out)."""
    size = RECORD.size
    return [RECORD.unpack_from(data, at) for at in range(0, len(data) - size + 1, size)]


def _record_at(f, index: int) -> Record:
    f.seek(index * RECORD.size)
    return RECORD.unpack(f.read(RECORD.size))


def first_at_or_after(f, count: int, offset: int) -> int:
    """Index of the first record whose offset is >= `offset` (records are in offset order)."""
    low, high = 0, count
    while low < high:
        middle = (low + high) // 2
        if _record_at(f, middle)[0] < offset:
            low = middle + 1
        else:
            high = middle
    return low


def records_between(path: str, start: int, end: int, most: int = MAX_RECORDS + 1) -> list[Record]:
    """Records of output.times for the bytes [start, end): the one in force at `start` (the last at
    or before it), then those within; at most `most`; none without the file."""
    try:
        # not blocking, and only a file: the job may have put a FIFO or a device in its place
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        try:
            count = os.fstat(f.fileno()).st_size // RECORD.size
            index = max(0, first_at_or_after(f, count, start + 1) - 1)
            f.seek(index * RECORD.size)
            found = unpack(f.read(min(count - index, most) * RECORD.size))
        except (OSError, struct.error):  # cut short while read: the log is read without its times
            return []
    return [r for r in found if r[0] < end]


def framed(data: bytes, records: list[Record], offset: int) -> bytes:
    """`<log bytes> <record bytes>\\n`, the log bytes, the records; cut at MAX_RECORDS records."""
    if len(records) > MAX_RECORDS:
        data = data[:max(0, records[MAX_RECORDS][0] - offset)]
        records = records[:MAX_RECORDS]
    times = pack(records)
    return b"%d %d\n" % (len(data), len(times)) + data + times


def unframe(body: bytes, limit: int) -> tuple[bytes, list[Record]]:
    """What `framed` made, read leniently (the answer of a host that may be hostile): the log bytes
    (at most `limit`) and the whole records after them; a header that is not one gives no records
    and no bytes."""
    head, _, rest = body.partition(b"\n")
    parts = head.split(b" ")
    if len(parts) != 2 or not all(p.isdigit() and len(p) <= 20 for p in parts):
        return b"", []
    size, times = int(parts[0]), int(parts[1])
    return rest[:min(size, limit)], unpack(rest[size:size + times])
