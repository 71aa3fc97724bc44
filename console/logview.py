"""A run's logs as one text download: one job's whole log, or every job's with `[group/rank]` lines."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from django.conf import settings

from runs import log_storage
from runs.services import logs


def whole(job) -> Iterator[bytes]:
    """The job's log from the start, a chunk at a time, at most LOG_COPY_LIMIT bytes: the size the
    server keeps of a finished job, so a job printing without end cannot make a download endless."""
    limit = int(settings.MUSTER["LOG_COPY_LIMIT"])
    offset = 0
    while offset < limit:
        chunk = logs.read(job, offset, min(log_storage.CHUNK, limit - offset))
        if not chunk:
            return
        offset += len(chunk)
        yield chunk
    if logs.read(job, offset, 1):
        yield log_storage.truncated_note(limit)


def prefixed(jobs: Iterable) -> Iterator[bytes]:
    """Every job's log in job order, each line led by `[group/rank] ` as `muster logs` prints them."""
    for job in jobs:
        prefix = f"[{job.node_group_name}/{job.node_group_rank}] ".encode()
        rest = b""
        for chunk in whole(job):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            if lines:
                yield b"".join(prefix + line + b"\n" for line in lines)
        if rest:
            yield prefix + rest + b"\n"


def filename(run, job=None) -> str:
    if job is None:
        return f"{run.name}-all-jobs.log"
    return f"{run.name}-job{job.job_num}" + (f"-submission{job.submission_num}" if job.superseded else "") + ".log"
