"""A job's output.log, written through a pipe by the runner rather than by the job itself, so it
can be capped: a job that prints without end must not fill its host's disk (for a local job, the
server's data directory, where a full disk stops the server's own writes).

Up to `log_limit` bytes (the spec's, set by the server from MUSTER_JOB_LOG_LIMIT) are kept, the
last of them a line that says the rest was dropped; the job goes on, its further output read and
dropped so that it never blocks on a full pipe. A write the disk refuses (full, over quota) drops
that output too, said in a line once the disk takes writes again: the job is neither held nor
failed because its host's disk filled, and it frees the space of nothing it did not write.

Each chunk kept is stamped in output.times (runner/log_times.py) with the host's clock as the pump
read it: the time of a line is when the job wrote it, not when the server copied it. The stamps
count against `log_limit` with the log.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, BinaryIO

from .log_times import GRAIN_MS, RECORD

DEFAULT_LOG_LIMIT = 64 << 20  # a spec without log_limit (an older server): the server's default
READ_SIZE = 64 * 1024
DRAIN_TIMEOUT = 5.0  # after the job's processes were killed: a pipe some escaped process still holds


def log_limit(spec: dict[str, Any]) -> int:
    value = spec.get("log_limit")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else DEFAULT_LOG_LIMIT


def cut_line(limit: int) -> bytes:
    return (f"\n[muster: this job's output reached its log limit ({limit} bytes, MUSTER_JOB_LOG_LIMIT): "
            f"the rest is not kept; the job goes on]\n").encode()


def lost_line(lost: int, why: str) -> bytes:
    return f"\n[muster: {lost} bytes of this job's output were lost: writing its log failed ({why})]\n".encode()


class OutputLog:
    """Copies a job's stdout+stderr pipe into output.log in a thread: start(pipe), then finish()."""

    def __init__(self, path: str, limit: int, times_path: str = "") -> None:
        self.path = path
        self.times_path = times_path or os.path.join(os.path.dirname(path), "output.times")
        self.limit = max(limit, len(cut_line(limit)))
        self._thread: threading.Thread | None = None
        self.why = ""  # why the last write failed

    def start(self, pipe: BinaryIO) -> OutputLog:
        self._thread = threading.Thread(target=self._copy, args=(pipe,), name="output-log", daemon=True)
        self._thread.start()
        return self

    def finish(self) -> None:
        """Wait for the pipe's end (every writer gone), or DRAIN_TIMEOUT."""
        if self._thread is not None:
            self._thread.join(DRAIN_TIMEOUT)

    def _copy(self, pipe: BinaryIO) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        stamps = _Stamps(self.times_path)
        try:
            room = self.limit - len(cut_line(self.limit))
            lost, cut = 0, False
            while True:
                chunk = os.read(pipe.fileno(), READ_SIZE)
                if not chunk:
                    return
                if cut:
                    continue  # read and dropped: the job must not block on a full pipe
                if lost and not _write(fd, lost_line(lost, self.why)):
                    lost += len(chunk)
                    continue
                lost = 0
                size = os.fstat(fd).st_size  # a container job's runner may have written a line first
                kept = chunk[:max(0, room - size - stamps.size - RECORD.size)]
                if kept and not _write(fd, kept, self):
                    lost += len(chunk)
                    continue
                if kept:
                    stamps.add(size)
                if len(kept) < len(chunk):
                    _write(fd, cut_line(self.limit))
                    cut = True
        finally:
            os.close(fd)
            stamps.close()
            pipe.close()


class _Stamps:
    """output.times, appended a record per chunk kept, GRAIN_MS apart at least."""

    def __init__(self, path: str) -> None:
        self.size, self.last = 0, -GRAIN_MS
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:
            self.fd = -1  # the log goes on without times: the server stamps lines as it copies them

    def add(self, offset: int) -> None:
        ms = int(time.time() * 1000)
        if self.fd < 0 or 0 <= ms - self.last < GRAIN_MS:
            return
        if _write(self.fd, RECORD.pack(offset, max(ms, 0))):
            self.size += RECORD.size
            self.last = ms
            return
        try:  # a torn record would shift every later one: back to the last whole record
            os.ftruncate(self.fd, self.size)
        except OSError:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def _write(fd: int, data: bytes, log: OutputLog | None = None) -> bool:
    """Whether all of `data` was written; False when the disk refused it (full, over quota, an I/O
    error): the caller drops it, and the job goes on."""
    try:
        view, done = memoryview(data), 0
        while done < len(data):
            done += os.write(fd, view[done:])
        return True
    except OSError as exc:
        if log is not None:
            log.why = exc.strerror or str(exc)
        return False
