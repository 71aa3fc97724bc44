"""Giving back a claimed job: the lease cleared, and a job that turned terminating while held
handed to finish_job (whose own claim could not succeed until now).

In the engine, not beside move_job in runs/transitions.py: a give-back is the claim protocol's
(engine/claims.py), and the tables do not import the engine.
"""

from __future__ import annotations

from engine import claims, messages
from runs.choices import JobStatus
from runs.models import Job


def hand_over_if_terminating(job_id: int) -> str | None:
    """Called after a task gave back its lease: a job it moved to `terminating` meanwhile could not
    be claimed by the finish_job enqueued at that moment, so enqueue it again now.

    Returns the job's status, so the caller decides its next step without reading the row again.
    """
    status = Job.objects.filter(pk=job_id).values_list("status", flat=True).first()
    if status == JobStatus.TERMINATING:
        messages.finish_job(job_id)
    return status


def release_job(job: Job, token: str, keep, **updates) -> str | None:
    """Give back the caller's lease on `job` and return the job's status as it is left.

    One statement in the common case: the job is still in one of `keep`, as the caller left it.
    A job that is terminating now (moved by the caller, or by another process while the lease was
    held) is handed to finish_job, whose own claim could not succeed until now.
    """
    keep = tuple(keep)
    if job.status in keep and claims.release(Job, job.pk, token, where={"status__in": keep}, **updates):
        return job.status
    claims.release(Job, job.pk, token, **updates)
    if job.status == JobStatus.TERMINATING:  # the caller moved it (terminate_job(held=True))
        messages.finish_job(job.pk)
        return job.status
    return hand_over_if_terminating(job.pk)
