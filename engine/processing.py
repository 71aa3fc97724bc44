"""The run processor: derives a run's status from its jobs, tears down, retries, finishes.

`process_run` is the body of an idempotent task, nudged after every job transition and swept by
beat. Failure of any job tears the whole run down (or resubmits it under the retry policy). A
service is kept at its replicas instead (engine/replicas/keep.py): it runs until it is stopped.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from engine import claims, failure_policy, messages, outcome, restarts
from engine.finishing import end_active_jobs
from engine.replicas import keep
from engine.replicas import rows as replica_rows
from engine.tuning import GATHERED
from events.models import Event
from events.services import record
from muster import compiled
from muster.claimable import Lease
from runs.choices import FAILING_REASONS, RETRY_EVENT, JobReason, JobStatus, RunReason, RunStatus, StopRequest
from runs.configuration.stored import StoredService, run_configuration
from runs.job_rows import create_jobs
from runs.limits import retry_duration
from runs.models import Job, Run
from runs.transitions import move_run

ACTIVE_RUN = (RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING, RunStatus.TERMINATING)


# the reads of every derive, compiled once (muster/compiled.py)
_RUN = compiled.Select(lambda pk: Run.objects.select_related("project").filter(pk=pk), int)
_JOBS = compiled.Select(lambda run_id: Job.objects.filter(run_id=run_id, superseded=False).order_by("job_num"),
                        int)  # Run.current_jobs


def process_run(run_id: int) -> bool:
    # a teardown's ends go to finish_jobs together (engine/messages.py `gathered`), not a message each
    with messages.gathered(GATHERED):
        return claims.claimed(Run, run_id, "process_run", _process,
                              status__in=[*ACTIVE_RUN, RunStatus.PENDING]) is not None


def process_runs(run_ids: list[int]) -> set[int]:
    """process_run for several runs in one claimed step (the runs of the jobs one finish_jobs step
    ended, engine/messages.py `gathered`): claimed together, each derived as process_run would (an
    error backs off that run alone), given back together. Returns the ids this step held."""
    due = Run.objects.filter(pk__in=run_ids, status__in=[*ACTIVE_RUN, RunStatus.PENDING])
    with messages.gathered(GATHERED):  # the ends its teardowns ask for go together too
        held = claims.claimed_batch(due, len(run_ids), "process_runs", _process_each)
    return set(held.pks)


def _process_each(held: claims.Held) -> dict[int, claims.Outcome]:
    outcomes = {}
    for pk in held.pks:
        with held.row(pk):
            outcomes[pk] = _process_one(pk, held.lease)
    return outcomes


def _process(held: claims.Held) -> claims.Outcome:
    return _process_one(held.pk, held.lease)


def _process_one(pk: int, lease: Lease) -> claims.Outcome:
    derived_at = timezone.now()  # before the jobs are read: a change after this is derived again
    run = _RUN.get(pk)
    try:
        if run.status == RunStatus.PENDING:
            _resubmit_when_due(run, lease)
        else:
            _derive(run, lease)
    except Exception as exc:
        _note_failed_derive(run, exc)
        raise  # the claimed step gives the run back with a backoff
    # Only a derive that finished is recorded: one that failed half-way and still wrote
    # derived_at would hide the run's job changes from the sweep for ever (wedged in submitted).
    return outcome.with_learned(run, derived_at=derived_at, then=(partial(_derive_again_if_moved, run, derived_at),))


def _derive_again_if_moved(run: Run, derived_at) -> None:
    """Once the run is free: a job that moved while we held it had its nudge dropped (the run was
    leased), so derive again. So did a service's update (it takes no lease): a deployment other than
    the one read is one to roll out (only a service, whose desired_replicas is never empty, asks)."""
    if run.status not in ACTIVE_RUN:
        return
    if Job.objects.filter(run_id=run.pk, superseded=False, status_changed_at__gte=derived_at).exists() or (
            run.desired_replicas and Run.objects.filter(pk=run.pk).exclude(deployment_num=run.deployment_num).exists()):
        messages.process_run(run.pk)


def _note_failed_derive(run: Run, exc: Exception) -> None:
    """One event per distinct failure, so whoever looks at a stuck run sees why (the sweep tries
    it again on every pass; repeating the same event each time would bury the others)."""
    message = f"could not derive the run's status: {type(exc).__name__}: {exc}"[:1000]
    last = Event.objects.filter(run_id=run.id).order_by("-id").values_list("message", flat=True).first()
    if last != message:
        record(run.project_id, f"run {run.name}", message, status=run.status, run_id=run.id)


def _derive(run: Run, lease: Lease) -> None:
    """`lease`: process_run's hold on the run, which each move of the run takes."""
    jobs = _JOBS.all(run.pk)
    for job in jobs:
        job.run = run  # as run.jobs would: one run object, not a read per job
    service = isinstance(run_configuration(run), StoredService)
    if run.stop_requested:
        reason = JobReason.ABORTED_BY_USER if run.stop_requested == StopRequest.ABORT else JobReason.TERMINATED_BY_USER
        run_reason = RunReason.ABORTED_BY_USER if run.stop_requested == StopRequest.ABORT else RunReason.STOPPED_BY_USER
        if service:
            replica_rows.leave_pool(jobs, "the service stops")
        _teardown(run, reason, RunStatus.TERMINATED, run_reason, jobs=jobs, lease=lease)
        return
    if service:  # a service runs until it is stopped: its replicas are kept, not derived from
        cause = keep.keep(run, jobs, lease)
        if cause is not None:  # a failure its retry does not replace: the service fails, as a task's run
            replica_rows.leave_pool(jobs, f"replica {cause.node_group_name}/{cause.replica_num} failed")
            _fail_or_retry(run, cause, jobs, lease, retry=False)
        return
    failed = [j for j in jobs if j.termination_reason in FAILING_REASONS]
    ignored: set[int] = set()
    if failed:
        verdict = failure_policy.judge(run, jobs, failed)
        if verdict.spent is not None:
            _teardown(run, JobReason.TERMINATED_BY_SERVER, RunStatus.FAILED, RunReason.RETRY_LIMIT_EXCEEDED,
                      cause=verdict.spent, jobs=jobs, lease=lease)
        elif verdict.fail is not None:
            _fail_or_retry(run, verdict.fail, jobs, lease)
        elif verdict.restart_run is not None:
            _restart_run(run, verdict.restart_run, jobs, lease)
        elif verdict.restart:
            restarts.restart(run, jobs, verdict.restart)
        if verdict.spent or verdict.fail or verdict.restart_run or verdict.restart:
            return
        ignored = verdict.ignored  # the run goes on without them
    master = jobs[0]
    stop_criteria = run_configuration(run).stop_criteria
    if stop_criteria == "master-done" and master.status == JobStatus.DONE:
        _teardown(run, JobReason.MASTER_DONE, RunStatus.DONE, RunReason.MASTER_JOB_DONE, jobs=jobs, lease=lease)
        return
    if all(j.status == JobStatus.DONE or (j.pk in ignored and j.finished) for j in jobs):
        restarts.hand_back_kept(run, jobs)
        move_run(run, RunStatus.DONE, frm=ACTIVE_RUN, termination_reason=RunReason.ALL_JOBS_DONE, lease=lease)
        return
    if all(j.finished for j in jobs):  # ended by the server without a failure (e.g. max_duration)
        move_run(run, RunStatus.TERMINATED, frm=ACTIVE_RUN, termination_reason=RunReason.ALL_JOBS_DONE,
                 termination_message="every job ended", lease=lease)
        return
    # the run as read under its claim: one already where its jobs say (most nudges) is not written
    if any(j.status == JobStatus.RUNNING for j in jobs):
        if run.status in (RunStatus.SUBMITTED, RunStatus.PROVISIONING):
            move_run(run, RunStatus.RUNNING, frm=[RunStatus.SUBMITTED, RunStatus.PROVISIONING], lease=lease)
    elif any(j.status in (JobStatus.PROVISIONING, JobStatus.PULLING) for j in jobs):
        if run.status == RunStatus.SUBMITTED:
            move_run(run, RunStatus.PROVISIONING, frm=[RunStatus.SUBMITTED], lease=lease)


def _fail_or_retry(run: Run, cause: Job, jobs: list[Job], lease: Lease, retry: bool = True) -> None:
    """A failure no rule of its group took: the run's `retry`, else the run fails (`retry` False: a
    service's replica, which its own replacement would have retried: keep.py)."""
    if retry and _retry_allowed(run, cause.termination_reason):
        _teardown(run, JobReason.TERMINATED_BY_SERVER, RunStatus.PENDING, "", retry=True, cause=cause, jobs=jobs,
                  lease=lease)
    else:
        reason = RunReason.RETRY_LIMIT_EXCEEDED if _retry_configured(run, cause.termination_reason) \
            else RunReason.JOB_FAILED
        _teardown(run, JobReason.TERMINATED_BY_SERVER, RunStatus.FAILED, reason, cause=cause, jobs=jobs, lease=lease)


def _restart_run(run: Run, cause: Job, jobs: list[Job], lease: Lease) -> None:
    """`restart-run`: the whole run again (dstack's retry), counted against the group's
    max_restarts once per failure and bounded by retry.duration (an hour when `retry` is not set)."""
    index = str(cause.node_group_index)
    record = (run.restarts or {}).get(index) or {}
    if record.get("submission") != cause.submission_num:
        counted = {**(run.restarts or {}), index: {"count": int(record.get("count", 0)) + 1,
                                                   "submission": cause.submission_num, "whole_run": True}}
        outcome.learn(run, restarts=counted)  # written with the give-back
    if _within(run, cause.termination_reason, retry_duration(run_configuration(run))):
        _teardown(run, JobReason.TERMINATED_BY_SERVER, RunStatus.PENDING, "", retry=True, cause=cause, jobs=jobs,
                  lease=lease)
    else:
        _teardown(run, JobReason.TERMINATED_BY_SERVER, RunStatus.FAILED, RunReason.RETRY_LIMIT_EXCEEDED, cause=cause,
                  jobs=jobs, lease=lease)


def _retry_configured(run: Run, job_reason: str) -> bool:
    retry = run_configuration(run).retry
    event = RETRY_EVENT.get(job_reason)
    return bool(retry and event and event in retry.on_events)


def _retry_allowed(run: Run, job_reason: str) -> bool:
    if not _retry_configured(run, job_reason):
        return False
    return _within(run, job_reason, retry_duration(run_configuration(run)))


def _within(run: Run, job_reason: str, duration: int) -> bool:
    """Whether the next attempt starts inside retry.duration, counted as dstack counts it: from
    the run's submission for no-capacity, from this failure (the last one) for the others."""
    now = timezone.now()
    since = run.submitted_at if RETRY_EVENT.get(job_reason) == "no-capacity" else now
    return now + _backoff(run) < since + timedelta(seconds=duration)


def _backoff(run: Run) -> timedelta:
    steps = settings.MUSTER["RETRY_BACKOFF"]
    return timedelta(seconds=steps[min(run.retry_attempts, len(steps) - 1)])


def _teardown(run: Run, job_reason: str, final: str, run_reason: str, retry: bool = False, cause=None,
              jobs: list[Job] | None = None, *, lease: Lease) -> None:
    """Stop every active job; once none is active, move the run to `final`. `jobs`: the run's
    current jobs as _derive read them under the run's claim (not read again)."""
    with transaction.atomic():
        if run.status != RunStatus.TERMINATING:
            why = f"job {cause.job_num} {cause.termination_reason}" if cause else (run_reason or job_reason)
            move_run(run, RunStatus.TERMINATING, frm=ACTIVE_RUN, message=f"terminating: {why}", lease=lease)
        still_active = end_active_jobs(run, job_reason, jobs=jobs)
        if still_active:
            return
        restarts.hand_back_kept(run, jobs)
        if retry:
            move_run(run, RunStatus.PENDING, frm=[RunStatus.TERMINATING], next_retry_at=timezone.now() + _backoff(run),
                     retry_attempts=run.retry_attempts + 1, fleet=None, lease=lease,
                     message=f"will retry in {_backoff(run).total_seconds():.0f}s "
                             f"(after {cause.termination_reason} of job {cause.job_num})")
            messages.process_run(run.pk)  # the sweep resubmits when the backoff is over
        else:
            message = f"job {cause.job_num} ended with {cause.termination_reason}" if cause else ""
            move_run(run, final, frm=[RunStatus.TERMINATING], termination_reason=run_reason, lease=lease,
                     termination_message=cause.termination_message if cause else "", message=message or None)


def _resubmit_when_due(run: Run, lease: Lease) -> None:
    if run.stop_requested:
        move_run(run, RunStatus.TERMINATED, frm=[RunStatus.PENDING], termination_reason=RunReason.STOPPED_BY_USER,
                 lease=lease)
        return
    if run.next_retry_at and run.next_retry_at > timezone.now():
        return
    previous = list(run.current_jobs())
    with transaction.atomic():
        new_num = run.submission_num + 1
        if not move_run(run, RunStatus.SUBMITTED, frm=[RunStatus.PENDING], submission_num=new_num, lease=lease,
                        next_retry_at=None, message=f"resubmitted (submission {new_num})"):
            return
        Job.objects.filter(pk__in=[j.pk for j in previous]).update(superseded=True)
        create_jobs(run, [j.spec for j in previous], submission_num=new_num)
        messages.provision_job(Job.objects.get(run=run, submission_num=new_num, job_num=0).pk)
