"""Job logs, always read from the server's copy (runs/log_storage.py; the engine writes it).

A reader never reaches the host: when each read of a running job's log was an SSH login of its
own, 30 readers made the host's sshd drop connections (MaxStartups), the watcher's among them, and
the job failed as instance_unreachable. engine/log_copy.py fetches what a job prints over the
connections the engine opens anyway.
"""

from __future__ import annotations

from runs import log_stamps
from runs.log_storage import CHUNK, stored_path
from runs.models import Job


def read(job: Job, start: int = 0, limit: int = CHUNK) -> bytes:
    """Bytes of the job's log from `start`, as far as the server has them (live: a look behind)."""
    try:
        with stored_path(job).open("rb") as f:
            f.seek(start)
            return f.read(limit)
    except (FileNotFoundError, NotADirectoryError):  # nothing copied yet (or no usable log directory)
        return b""


def line_times(job: Job, start: int, data: bytes) -> list[list[int]] | None:
    """[epoch ms, lines] runs: when each line beginning in `data` (read from `start`) was written, by
    its host's clock as its runner received it (runs/log_stamps.py); None: a copy without times."""
    try:
        return log_stamps.line_times(job, start, data)
    except OSError:  # an unreadable times file leaves the lines without times, the log still read
        return None


def times_at(job: Job, start: int, data: bytes, positions: list[int]) -> list[int] | None:
    """Epoch ms when the runner received the byte at each of `positions` of `data` (runs/log_stamps.py)."""
    try:
        return log_stamps.times_at(job, start, data, positions)
    except OSError:
        return None
