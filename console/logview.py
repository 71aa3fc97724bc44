"""A run's logs as one text download: one job's whole log, or every job's lines with `[group/rank]`,
in the order they were written (each line's time: runs/log_stamps.py)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from django.conf import settings

from runs import log_storage
from runs.services import logs


def _chunks(job) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of the job's log from the start, at most LOG_COPY_LIMIT bytes: the size the
    server keeps of a finished job, so a job printing without end cannot make a download endless."""
    limit = int(settings.MUSTER["LOG_COPY_LIMIT"])
    offset = 0
    while offset < limit:
        chunk = logs.read(job, offset, min(log_storage.CHUNK, limit - offset))
        if not chunk:
            return
        yield offset, chunk
        offset += len(chunk)


def whole(job) -> Iterator[bytes]:
    """The job's log from the start, a chunk at a time (as _chunks), then a line if it was cut."""
    offset = 0
    for offset, chunk in _chunks(job):
        yield chunk
        offset += len(chunk)
    if offset >= int(settings.MUSTER["LOG_COPY_LIMIT"]) and logs.read(job, offset, 1):
        yield log_storage.truncated_note(int(settings.MUSTER["LOG_COPY_LIMIT"]))


def _expand(runs: list[list[int]] | None) -> Iterator[int]:
    for ms, count in runs or []:
        for _ in range(count):
            yield ms


def timed_lines(job) -> Iterator[tuple[int, bytes]]:
    """(epoch ms, line) of the job's log, its lines cut at newlines; 0 for a copy without times."""
    rest, rest_ms, ms = b"", None, 0  # rest_ms: the time of the line begun and not ended yet
    for offset, chunk in _chunks(job):
        times = _expand(logs.line_times(job, offset, chunk))
        pieces = chunk.split(b"\n")
        for index, piece in enumerate(pieces):
            ending = index < len(pieces) - 1
            if index == 0 and rest_ms is not None:
                ms, piece = rest_ms, rest + piece  # the line the last chunk began
            elif not ending and not piece:
                break  # the chunk ended a line: the next begins in the next chunk
            else:
                ms = next(times, ms)
            if ending:
                yield ms, piece
                rest, rest_ms = b"", None
            else:
                rest, rest_ms = piece, ms
    if rest_ms is not None:
        yield rest_ms, rest


def prefixed(jobs: Iterable) -> Iterator[bytes]:
    """Every job's lines, each led by `[group/rank] ` as `muster logs` prints them, in time order
    (the lines of one time in job order)."""
    streams = [_prefixed_lines(job) for job in jobs]
    batch: list[bytes] = []
    for _, line in heapq.merge(*streams, key=lambda item: item[0]):
        batch.append(line)
        if len(batch) >= 1000:
            yield b"".join(batch)
            batch = []
    if batch:
        yield b"".join(batch)


def _prefixed_lines(job) -> Iterator[tuple[int, bytes]]:
    prefix = f"[{job.node_group_name}/{job.node_group_rank}] ".encode()
    for ms, line in timed_lines(job):
        yield ms, prefix + line + b"\n"


def filename(run, job=None) -> str:
    if job is None:
        return f"{run.name}-all-jobs.log"
    return f"{run.name}-job{job.job_num}" + (f"-submission{job.submission_num}" if job.superseded else "") + ".log"
