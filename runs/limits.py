"""What one project may have at once, and how long a run may be retried or wait: the server's caps,
checked when a run is planned or submitted, each refusal naming the setting that sets it.

A run that waits for a host of a full fleet (engine/submitted/waiting.py) holds no host, but each
is a row the sweep looks at again, and a wake of its project goes to the oldest: without a cap, one
project could queue thousands of runs for months (retry.duration was bounded only by the calendar).
The counts are read before the run's insert, so submits racing each other may pass a cap by the
number of requests in flight; a cap is a bound on what a project can pile up, not an exact quota.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework import status

from muster.api_errors import InvalidInput
from projects.models import Project
from runs.choices import RUN_FINISHED, WAITING_FOR_HOST, JobStatus
from runs.configuration import TaskConfiguration
from runs.configuration.stored import StoredRun
from runs.configuration.task_written import DEFAULT_RETRY_DURATION
from runs.models import Job, Run


class LimitReached(InvalidInput):
    """A project at one of the server's caps: 429, located like a 400, the message names the setting."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS


def check_retry_duration(conf: TaskConfiguration) -> None:
    """retry.duration (how long a run is retried, and how long it may wait for capacity) is at most
    MUSTER_MAX_RETRY_DURATION."""
    limit = int(settings.MUSTER["MAX_RETRY_DURATION"])
    duration = conf.retry.duration if conf.retry is not None else None
    if duration is not None and limit > 0 and duration > limit:
        raise InvalidInput(["retry", "duration"], (
            f"retry.duration {format_duration(duration)} is longer than this server allows: at most "
            f"{format_duration(limit)} (MUSTER_MAX_RETRY_DURATION)"))


def retry_duration(conf: StoredRun) -> int:
    """A run's retry.duration in seconds (an hour when unset), as the engine counts it: at most
    MUSTER_MAX_RETRY_DURATION, so a run stored before the cap existed or was lowered is held to it."""
    duration = conf.retry.duration if conf.retry is not None else None
    duration = DEFAULT_RETRY_DURATION if duration is None else duration
    limit = int(settings.MUSTER["MAX_RETRY_DURATION"])
    return min(duration, limit) if limit > 0 else duration


def check_project_caps(project: Project, configuration: dict) -> None:
    """The project's unfinished runs stay under MUSTER_MAX_ACTIVE_RUNS_PER_PROJECT, and its runs
    waiting for a host under MUSTER_MAX_WAITING_RUNS_PER_PROJECT (checked for a run that may wait:
    its retry lists no-capacity). 0 turns a cap off."""
    active = int(settings.MUSTER["MAX_ACTIVE_RUNS_PER_PROJECT"])
    if active > 0 and _bounded_count(Run.objects.filter(project=project).exclude(status__in=RUN_FINISHED),
                                     active) >= active:
        raise LimitReached(["project"], (
            f"project {project.name} has {active} runs not finished, the most this server allows "
            f"(MUSTER_MAX_ACTIVE_RUNS_PER_PROJECT): stop or wait for some before submitting more"))
    waiting = int(settings.MUSTER["MAX_WAITING_RUNS_PER_PROJECT"])
    may_wait = "no-capacity" in ((configuration.get("retry") or {}).get("on_events") or [])
    if waiting > 0 and may_wait and waiting_count(project.pk, waiting) >= waiting:
        raise LimitReached(["retry", "on_events"], (
            f"project {project.name} has {waiting} runs waiting for a free host, the most this server allows "
            f"(MUSTER_MAX_WAITING_RUNS_PER_PROJECT): submit it once some have started, or without "
            f"`no-capacity` in retry.on_events (it then fails at once on a full fleet)"))


def waiting_count(project_id: int, limit: int) -> int:
    """How many of the project's runs wait for a host (job 0 of each), counted up to `limit`."""
    return _bounded_count(Job.objects.filter(
        run__project_id=project_id, status=JobStatus.SUBMITTED, superseded=False, waiting_master_job=False,
        waiting_for__startswith=WAITING_FOR_HOST), limit)


def format_duration(seconds: int) -> str:
    """Seconds as the configuration writes them, in the largest whole unit (604800 -> 7d, 5400 -> 90m)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _bounded_count(queryset, limit: int) -> int:
    # counts no further than the cap: a project far past it costs no more to refuse than one at it
    return queryset.values("pk")[:limit].count()
