"""The replica rows keep.py writes, each with its event: a failed replica's new submission, a new
replica, a replica taken out of the endpoint's pool to be removed, one left behind for good.

Written by process_run while it holds the run (so by one worker at a time); each new row is
claimable at once and its provision_job leaves after commit (engine/messages.py)."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from engine import messages
from engine.tuning import MAX_DRAIN_DELAY
from events.services import record
from runs.choices import JOB_FINISHED, JobReason, JobStatus
from runs.configuration.replica_specs import new_replica_spec
from runs.job_rows import new_jobs
from runs.models import Job, Run
from runs.transitions import move_job, terminate_job


def drain_delay() -> float:
    return min(max(float(settings.MUSTER["DRAIN_DELAY"]), 0.0), MAX_DRAIN_DELAY)


def _say(run: Run, job: Job, message: str) -> None:
    record(run.project_id, f"job {run.name}/{job.job_num}", message, status=job.status, run_id=run.pk, job_id=job.pk,
           instance_id=job.instance_id)


def supersede(job: Job) -> bool:
    """An ended replica the service goes on without (drained, or of an older deployment).

    A plain UPDATE without the job's lease, safe only because a finished job is never moved or held
    again: it is guarded by the finished statuses, so a live replica is never hidden from the reads
    that skip superseded jobs (the endpoint's routes, process_run's jobs) while it still runs."""
    done = Job.objects.filter(pk=job.pk, superseded=False, status__in=JOB_FINISHED).update(superseded=True) == 1
    job.superseded = job.superseded or done
    return done


def replace(run: Run, old: Job, why: str) -> Job | None:
    """A new submission of the replica `old` (same group, replica_num and job_num; the next
    submission_num), `old` superseded in the same transaction. None: somebody did it already."""
    with transaction.atomic():
        if not supersede(old):
            return None
        (new,) = Job.objects.bulk_create(new_jobs(run, [old.spec], old.submission_num + 1))
        new.fleet_id = old.fleet_id
        Job.objects.filter(pk=new.pk).update(fleet_id=old.fleet_id)
        _say(run, new, f"replica {old.node_group_name}/{old.replica_num}, submission {new.submission_num}: "
                       f"replaces submission {old.submission_num} ({why})")
        messages.provision_job(new.pk)
    return new


def next_job_num(run: Run, jobs: list[Job]) -> int:
    """A new replica's job number: above the highest the run ever used (its superseded rows' too)."""
    top = Job.objects.filter(run_id=run.pk).order_by("-job_num").values_list("job_num", flat=True).first() or 0
    return max([j.job_num for j in jobs] + [top]) + 1


def add(run: Run, group_name: str, replica_num: int, job_num: int, why: str) -> Job:
    """One more replica of the group, as the run's configuration makes it now (its deployment)."""
    spec = new_replica_spec(run.configuration, group_name, replica_num, job_num)
    with transaction.atomic():
        (new,) = Job.objects.bulk_create(new_jobs(run, [spec], run.submission_num))
        _say(run, new, f"replica {group_name}/{replica_num} (deployment {run.deployment_num}) added: {why}")
        messages.provision_job(new.pk)
    return new


def drain(job: Job, why: str) -> bool:
    """Take a replica out of the endpoint's pool to remove it: a running one keeps running for the
    drain delay (the requests it serves finish) and is stopped then (keep.py); one not running yet
    serves nothing and is ended at once."""
    if job.status != JobStatus.RUNNING:
        # drain_at marks it removed on purpose: its end is not a failure to replace (keep.py)
        return terminate_job(job, JobReason.TERMINATED_BY_SERVER, f"removed: {why}", drain_at=timezone.now())
    delay = drain_delay()
    return move_job(job, JobStatus.RUNNING, frm=[JobStatus.RUNNING], drain_at=timezone.now(), ready_at=None,
                    message=f"out of the endpoint's pool: {why}; stopped in {delay:.0f}s")



def leave_pool(jobs: list[Job], why: str) -> None:
    """Every ready replica out of the endpoint's pool, before the service's jobs are stopped (in the
    transaction of the stop: the endpoints drop them when it commits, before any stop signal leaves)."""
    for job in jobs:
        if job.status == JobStatus.RUNNING and job.ready_at is not None:
            move_job(job, JobStatus.RUNNING, frm=[JobStatus.RUNNING], ready_at=None,
                     message=f"out of the endpoint's pool: {why}")
