"""Copying job logs from their hosts to the server's copy (runs/log_storage.py), in the engine's steps.

While a job is on its host, each look of the engine at that host (the batch watch of running jobs,
advance_job before that) also fetches what the job printed since the last look, over the
connection the look opens anyway, and appends it to the copy (`Follow`, `take`). Once the job
has ended, keep_copy adds the rest. Readers (runs/services/logs.py) only read the copy. The runner's
stamps of the bytes (when each part was written) come in the same answer and are kept next to the
copy (runs/log_stamps.py).
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from backends.base import BackendError
from runs import log_stamps, log_storage
from runs.log_storage import CHUNK, over_quota_note, stored_path, truncated_note
from runs.models import Job

log = logging.getLogger(__name__)


def _copy_limit() -> int:
    return int(settings.MUSTER["LOG_COPY_LIMIT"])


def _open_copy(job: Job) -> int:
    """The copy, opened for appending and locked: the watch and the finish of a job never interleave."""
    path = stored_path(job)
    # Output may print secrets: the copy is as private as the runner's original (0700 / 0600).
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass
class Follow:
    """What one look at a job's host fetches of its log besides the runner's status."""

    runner_job_id: str
    offset: int  # bytes the server has
    room: int  # bytes the copy may still take (LOG_COPY_LIMIT)
    data: bytes = b""
    stamps: list = field(default_factory=list)  # the host's (offset, epoch ms) of `data`

    def fetch(self, host, status: dict) -> None:
        """Network I/O only (the batch watcher runs it in its threads), after the status was read.

        One chunk at most per look, so a job that prints without end cannot hold its host's look
        (the health check of every job on it) for long; the next look goes on from there.
        """
        state = status.get("jobs", {}).get(self.runner_job_id)
        if not isinstance(state, dict):
            return
        size = state.get("log_size")  # None: a runner from before log_size, which is asked anyway
        want = min(CHUNK, self.room) if size is None else min(CHUNK, self.room, size - self.offset)
        if want <= 0:
            return
        try:
            self.data, self.stamps = host.read_log_timed(self.runner_job_id, self.offset, want)
            self.data = self.data[:want]
        except BackendError as exc:
            # the status answered, so the host is up: the next look fetches this part again
            log.info("log of job %s not fetched now: %s", self.runner_job_id, exc)


def follow(job: Job) -> Follow | None:
    """What the next look at the job's host should fetch of its log; None if nothing can be there."""
    if not job.runner_submitted or not job.runner_job_id:
        return None
    try:
        offset = stored_path(job).stat().st_size
    except FileNotFoundError:
        offset = 0
    except OSError as exc:  # an unusable log directory must not hold the look at the host
        log.warning("job %s: its live log cannot be kept: %s", job, exc)
        return None
    room = _copy_limit() - offset
    return Follow(job.runner_job_id, offset, room) if room > 0 else None


def take(job: Job, fetched: Follow | None) -> None:
    """Append what a look fetched to the job's copy, if the copy is still where the look began."""
    if fetched is None or not fetched.data:
        return
    try:
        fd = _open_copy(job)
        with os.fdopen(fd, "ab") as out:
            if os.fstat(fd).st_size == fetched.offset:  # else another look or the finish got there first
                out.write(fetched.data)
                out.flush()
                log_stamps.append(job, fetched.offset, fetched.data, fetched.stamps)
    except OSError as exc:
        # The server's disk (full, unwritable) must not hold the watch of the job; keep_copy tries again.
        log.warning("job %s: its live log could not be kept: %s", job, exc)


def keep_copy(job: Job, host) -> None:
    """Copy the rest of the log to the server before the runner's job directory is removed.

    At most LOG_COPY_LIMIT bytes, then a line that says so: a job that printed without end must
    not hold its finish_job (and its host) for as long as the copy takes, nor fill the server's disk.
    Goes on from what the watch copied while the job ran. Within the project's log quota too
    (older runs' logs make room first), or cut with a line: the live copy of a running job is not
    held to the quota, its finished copy is.
    """
    path = stored_path(job)
    budget = log_storage.Budget(job, path)
    try:
        _copy(job, host, path, _copy_limit(), budget)
    except OSError:
        # A full disk: a part of the log without the line that says it is cut would pass for all
        # of it, and deleting it gives back the space it took.
        path.unlink(missing_ok=True)
        log_stamps.times_path(job).unlink(missing_ok=True)
        raise


def _cut_for_quota(path: Path, size: int) -> bool:
    if not size:
        return False
    with path.open("rb") as f:
        f.seek(max(0, size - 200))
        return f.read().rstrip().endswith(b"(MUSTER_LOG_QUOTA)]")


def _copy(job: Job, host, path: Path, limit: int, budget: log_storage.Budget) -> None:
    fd = _open_copy(job)
    with os.fdopen(fd, "ab") as out:
        offset = os.fstat(fd).st_size
        if offset > limit or _cut_for_quota(path, offset):
            return  # a note is there: copied already
        if offset:
            kept = budget.take(offset)  # what the watch copied counts against the quota too
            if kept < offset:
                os.ftruncate(fd, kept)
                out.write(over_quota_note(kept, budget.quota))
                return
        while offset < limit:
            chunk, stamps = host.read_log_timed(job.runner_job_id, offset, min(CHUNK, limit - offset))
            if not chunk:
                return
            allowed = budget.take(len(chunk))
            out.write(chunk[:allowed])
            out.flush()
            log_stamps.append(job, offset, chunk[:allowed], stamps)
            offset += allowed
            if allowed < len(chunk):
                out.write(over_quota_note(offset, budget.quota))
                return
        if host.read_log(job.runner_job_id, offset, 1):
            out.write(truncated_note(limit))
