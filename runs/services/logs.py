"""Job logs: live from the runner while the job runs, from the server's copy once it has finished."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from django.conf import settings

from backends.base import BackendError
from runs.models import Job
from runs.services import log_storage

log = logging.getLogger(__name__)
CHUNK = 1 << 20


def stored_path(job: Job) -> Path:
    # Keyed by the job's own UUID: a run name is reused by the next run of that name, whose
    # jobs must never be shown the previous run's output.
    return log_storage.path_for(job.run.project_id, job.uuid)


def read(job: Job, start: int = 0, limit: int = CHUNK) -> bytes:
    path = stored_path(job)
    if path.exists():
        with path.open("rb") as f:
            f.seek(start)
            return f.read(limit)
    if job.instance is None or not job.runner_submitted:
        return b""
    from backends.registry import compute_for_instance

    try:
        host = compute_for_instance(job.instance).runner_host(job.instance)
        try:
            return host.read_log(job.runner_job_id, start, limit)
        finally:
            host.close()
    except (BackendError, OSError) as exc:
        log.info("log of %s not readable now: %s", job, exc)
        return b""


def truncated_note(limit: int) -> bytes:
    return f"\n[muster: the server kept the first {limit} bytes of this log (MUSTER_LOG_COPY_LIMIT)]\n".encode()


def over_quota_note(kept: int, quota: int) -> bytes:
    return (f"\n[muster: the server kept the first {kept} bytes of this log: the project's logs reached their "
            f"quota of {quota} bytes (MUSTER_LOG_QUOTA)]\n").encode()


def keep_copy(job: Job, host) -> None:
    """Copy the log to the server before the runner's job directory is removed.

    At most LOG_COPY_LIMIT bytes, then a line that says so: a job that printed without end must
    not hold its finish_job (and its host) for as long as the copy takes, nor fill the server's disk.
    Within the project's log quota too (older runs' logs make room first), or cut with a line.
    """
    limit = int(settings.MUSTER["LOG_COPY_LIMIT"])
    path = stored_path(job)
    budget = log_storage.Budget(job, path)
    # Output may print secrets: the copy is as private as the runner's original (0700 / 0600).
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    try:
        _copy(job, host, path, limit, budget)
    except OSError:
        # A full disk: a part of the log without the line that says it is cut would pass for all
        # of it, and deleting it gives back the space it took.
        path.unlink(missing_ok=True)
        raise


def _copy(job: Job, host, path: Path, limit: int, budget: log_storage.Budget) -> None:
    offset = 0
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        while offset < limit:
            chunk = host.read_log(job.runner_job_id, offset, min(CHUNK, limit - offset))
            if not chunk:
                return
            allowed = budget.take(len(chunk))
            out.write(chunk[:allowed])
            offset += allowed
            if allowed < len(chunk):
                out.write(over_quota_note(offset, budget.quota))
                return
        if host.read_log(job.runner_job_id, offset, 1):
            out.write(truncated_note(limit))
