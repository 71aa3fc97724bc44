"""Ending jobs and runs: user stop/abort, teardown, and giving hosts back."""

from __future__ import annotations

import logging

from django.db import DatabaseError, transaction
from django.utils import timezone

from backends.base import BackendError
from backends.registry import compute_for_instance
from engine import attach_revokes, claims, log_copy, messages, runner_status
from engine.tuning import STOP_RECHECK
from events.services import record
from instances.transitions import hand_back
from runs.choices import (
    FINAL_STATUS,
    JOB_ACTIVE,
    JOB_UNFINISHED,
    RUNNER_LIVE,
    JobReason,
    JobStatus,
)
from runs.models import Job, Run
from runs.transitions import move_job, terminate_job

log = logging.getLogger(__name__)


def finish_job(job_id: int) -> bool:
    """Task body for a terminating job: stop the runner's process, keep the log, free the host."""
    with claims.claimed(Job, job_id, "finish_job", status=JobStatus.TERMINATING) as held:
        if held is None:
            return False
        if not _finish(held):
            claims.release(Job, job_id, held.token)
            messages.finish_job(job_id, countdown=STOP_RECHECK)
            return False
    return True


def _finish(held) -> bool:
    """False while the runner's job still runs (the caller looks again soon)."""
    job = Job.objects.select_related("run", "instance", "instance__fleet").get(pk=held.pk)
    final = FINAL_STATUS.get(job.termination_reason, JobStatus.TERMINATED)
    # whatever happens next (the host may never answer), the job's attach lines are due to go
    attach_revokes.end_job_grants(job)
    try:
        if job.runner_submitted and job.instance is not None and not _runner_finished(job):
            return False
    except BackendError as exc:
        log.info("job %s: runner unreachable while stopping (%s); handing its host back anyway", job, exc)
    with transaction.atomic():
        if job.instance_id:
            hand_back([job.instance], job)
        # the lease goes with the final move (we hold it, so nobody else changed the status)
        if move_job(job, final, frm=[JobStatus.TERMINATING], lease_until=None, lease_token=""):
            claims.forget(Job, held.token, [job.pk])
        else:
            claims.release(Job, job.pk, held.token)
    return True


def _runner_finished(job: Job) -> bool:
    """Stop the runner's job if it still runs; once it is over, copy its log and clean up."""
    host = compute_for_instance(job.instance).runner_host(job.instance)
    try:
        if job.instance.unreachable and job.termination_reason == JobReason.INSTANCE_UNREACHABLE:
            return True
        state = (runner_status.read(host)["jobs"].get(job.runner_job_id) or {}).get("state")
        if state in RUNNER_LIVE:
            waited = (timezone.now() - job.status_changed_at).total_seconds()
            if waited > 60:
                attach_revokes.revoke(job, host)
                return True  # the host does not stop it; the host is handed back regardless
            host.stop(job.runner_job_id)
            return False
        attach_revokes.revoke(job, host)  # before the log copy: the key must not outlive the job
        try:
            log_copy.keep_copy(job, host)
        except OSError as exc:
            # The server's disk (full, unwritable) must not hold the job and its host forever.
            log.warning("job %s: its log could not be kept: %s", job, exc)
            _say_log_lost(job, exc)
        finally:
            # The job directory holds its output (which may print secrets): it goes even when
            # the copy failed, rather than stay on the host for good.
            host.cleanup(job.runner_job_id)
        return True
    finally:
        host.close()


def _say_log_lost(job: Job, exc: OSError) -> None:
    # Otherwise the job's log just reads empty. On the embedded default the database shares the
    # full disk, so the event may not be written either: the warning above is then all there is.
    try:
        record(job.run.project_id, f"run {job.run.name}", f"the log of job {job.job_num} was not kept: "
               f"the server could not write it ({exc.strerror or exc})", status=job.status, run_id=job.run_id,
               job_id=job.pk)
    except DatabaseError as again:
        log.warning("job %s: could not record that its log was lost: %s", job, again)


def end_active_jobs(run: Run, reason: str, actor: str = "server") -> int:
    """Terminate every active job of the run's current submission; return how many are still active."""
    active = 0
    for job in run.current_jobs().select_related("run", "instance").filter(status__in=JOB_UNFINISHED):
        if job.status == JobStatus.TERMINATING:
            active += 1
            continue
        if job.status == JobStatus.SUBMITTED:
            # never started anywhere: nothing to stop, but a host a group batch reserved goes back
            if move_job(job, FINAL_STATUS[reason], frm=[JobStatus.SUBMITTED], termination_reason=reason,
                        actor=actor) and job.instance_id:
                hand_back([job.instance], job)
        else:
            terminate_job(job, reason, actor=actor)
            active += 1
    return active


def stop_jobs_on_group(group, actor: str = "api") -> None:
    for job in Job.objects.filter(instance__group=group, status__in=JOB_ACTIVE).select_related("run"):
        terminate_job(job, JobReason.TERMINATED_BY_SERVER, f"instance group {group.name} was deleted", actor=actor)
