"""The run processor: derives a run's status from its jobs, tears down, retries, finishes.

`process_run` is the body of an idempotent task, nudged after every job transition and swept by
beat. Failure of any job tears the whole run down (or resubmits it under the retry policy).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from engine import claims, messages
from engine.stopping import end_active_jobs
from events.models import Event
from events.services import record
from runs.choices import FAILING_REASONS, RETRY_EVENT, JobReason, JobStatus, RunReason, RunStatus, StopRequest
from runs.job_rows import create_jobs
from runs.models import Job, Run
from runs.transitions import move_run

ACTIVE_RUN = (RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING, RunStatus.TERMINATING)


def process_run(run_id: int) -> bool:
    with claims.claimed(Run, run_id, "process_run", status__in=[*ACTIVE_RUN, RunStatus.PENDING]) as held:
        if held is None:
            return False
        derived_at = timezone.now()  # before the jobs are read: a change after this is derived again
        run = Run.objects.select_related("project").get(pk=run_id)
        try:
            if run.status == RunStatus.PENDING:
                _resubmit_when_due(run)
            else:
                _derive(run)
        except Exception as exc:
            _note_failed_derive(run, exc)
            raise  # the claimed step gives the run back with a backoff
        # Only a derive that finished is recorded: one that failed half-way and still wrote
        # derived_at would hide the run's job changes from the sweep for ever (wedged in submitted).
        claims.release(Run, run_id, held.token, derived_at=derived_at)
    if held.failed:
        return True
    if run.status in ACTIVE_RUN and Job.objects.filter(
            run_id=run_id, submission_num=run.submission_num, status_changed_at__gte=derived_at).exists():
        # a job moved while we held the run: its nudge found the run leased and was dropped
        messages.derive_run(run_id)
    return True


def _note_failed_derive(run: Run, exc: Exception) -> None:
    """One event per distinct failure, so whoever looks at a stuck run sees why (the sweep tries
    it again on every pass; repeating the same event each time would bury the others)."""
    message = f"could not derive the run's status: {type(exc).__name__}: {exc}"[:1000]
    last = Event.objects.filter(run_id=run.id).order_by("-id").values_list("message", flat=True).first()
    if last != message:
        record(run.project_id, f"run {run.name}", message, status=run.status, run_id=run.id)


def _derive(run: Run) -> None:
    jobs = list(run.current_jobs())
    if run.stop_requested:
        reason = JobReason.ABORTED_BY_USER if run.stop_requested == StopRequest.ABORT else JobReason.TERMINATED_BY_USER
        run_reason = RunReason.ABORTED_BY_USER if run.stop_requested == StopRequest.ABORT else RunReason.STOPPED_BY_USER
        _teardown(run, reason, RunStatus.TERMINATED, run_reason)
        return
    failed = [j for j in jobs if j.termination_reason in FAILING_REASONS]
    if failed:
        first = failed[0]
        if _retry_allowed(run, first.termination_reason):
            _teardown(run, JobReason.TERMINATED_BY_SERVER, RunStatus.PENDING, "", retry=True, cause=first)
        else:
            reason = RunReason.RETRY_LIMIT_EXCEEDED if _retry_configured(run, first.termination_reason) \
                else RunReason.JOB_FAILED
            _teardown(run, JobReason.TERMINATED_BY_SERVER, RunStatus.FAILED, reason, cause=first)
        return
    master = jobs[0]
    stop_criteria = run.configuration.get("stop_criteria") or "all-done"
    if stop_criteria == "master-done" and master.status == JobStatus.DONE:
        _teardown(run, JobReason.MASTER_DONE, RunStatus.DONE, RunReason.MASTER_JOB_DONE)
        return
    if all(j.status == JobStatus.DONE for j in jobs):
        move_run(run, RunStatus.DONE, frm=ACTIVE_RUN, termination_reason=RunReason.ALL_JOBS_DONE)
        return
    if all(j.finished for j in jobs):  # ended by the server without a failure (e.g. max_duration)
        move_run(run, RunStatus.TERMINATED, frm=ACTIVE_RUN, termination_reason=RunReason.ALL_JOBS_DONE,
                 termination_message="every job ended")
        return
    if any(j.status == JobStatus.RUNNING for j in jobs):
        move_run(run, RunStatus.RUNNING, frm=[RunStatus.SUBMITTED, RunStatus.PROVISIONING])
    elif any(j.status in (JobStatus.PROVISIONING, JobStatus.PULLING) for j in jobs):
        move_run(run, RunStatus.PROVISIONING, frm=[RunStatus.SUBMITTED])


def _retry_configured(run: Run, job_reason: str) -> bool:
    retry = run.configuration.get("retry")
    event = RETRY_EVENT.get(job_reason)
    return bool(retry and event and event in retry.get("on_events", []))


def _retry_allowed(run: Run, job_reason: str) -> bool:
    if not _retry_configured(run, job_reason):
        return False
    duration = run.configuration["retry"].get("duration")
    duration = 3600 if duration is None else duration
    return timezone.now() + _backoff(run) < run.submitted_at + timedelta(seconds=duration)


def _backoff(run: Run) -> timedelta:
    steps = settings.MUSTER["RETRY_BACKOFF"]
    return timedelta(seconds=steps[min(run.retry_attempts, len(steps) - 1)])


def _teardown(run: Run, job_reason: str, final: str, run_reason: str, retry: bool = False, cause=None) -> None:
    """Stop every active job; once none is active, move the run to `final`."""
    with transaction.atomic():
        if run.status != RunStatus.TERMINATING:
            why = f"job {cause.job_num} {cause.termination_reason}" if cause else (run_reason or job_reason)
            move_run(run, RunStatus.TERMINATING, frm=ACTIVE_RUN, message=f"terminating: {why}")
        still_active = end_active_jobs(run, job_reason)
        if still_active:
            return
        if retry:
            move_run(run, RunStatus.PENDING, frm=[RunStatus.TERMINATING], next_retry_at=timezone.now() + _backoff(run),
                     retry_attempts=run.retry_attempts + 1, fleet=None,
                     message=f"will retry in {_backoff(run).total_seconds():.0f}s "
                             f"(after {cause.termination_reason} of job {cause.job_num})")
            messages.derive_run(run.pk)  # the sweep resubmits when the backoff is over
        else:
            message = f"job {cause.job_num} ended with {cause.termination_reason}" if cause else ""
            move_run(run, final, frm=[RunStatus.TERMINATING], termination_reason=run_reason,
                     termination_message=cause.termination_message if cause else "", message=message or None)


def _resubmit_when_due(run: Run) -> None:
    if run.stop_requested:
        move_run(run, RunStatus.TERMINATED, frm=[RunStatus.PENDING], termination_reason=RunReason.STOPPED_BY_USER)
        return
    if run.next_retry_at and run.next_retry_at > timezone.now():
        return
    previous = list(run.current_jobs())
    with transaction.atomic():
        new_num = run.submission_num + 1
        if not move_run(run, RunStatus.SUBMITTED, frm=[RunStatus.PENDING], submission_num=new_num,
                        next_retry_at=None, message=f"resubmitted (submission {new_num})"):
            return
        create_jobs(run, [j.spec for j in previous], submission_num=new_num)
        messages.place_job(Job.objects.get(run=run, submission_num=new_num, job_num=0).pk)
