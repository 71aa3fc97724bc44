"""The replica rows keep.py writes, each with its event: a failed replica's new submission (of all
its nodes for a multi-host replica), a new replica, a replica taken out of the endpoint's pool to
be removed, one left behind for good.

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
from runs.configuration.replica_specs import new_replica_specs
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
    """One more replica of the group, as the run's configuration makes it now (its deployment): its
    node 0, and for a multi-host replica its other nodes, which node 0 places (replica_placement).
    Returns node 0."""
    specs = new_replica_specs(run.configuration, group_name, replica_num, job_num)
    with transaction.atomic():
        new = Job.objects.bulk_create(new_jobs(run, specs, run.submission_num))
        nodes = f" ({len(new)} nodes, jobs {new[0].job_num}-{new[-1].job_num})" if len(new) > 1 else ""
        _say(run, new[0], f"replica {group_name}/{replica_num} (deployment {run.deployment_num}) added{nodes}: {why}")
        messages.provision_job(new[0].pk)
    return new[0]


def replace_replica(run: Run, old: list[Job], hosts: list | None, why: str) -> list[Job]:
    """A new submission of every node of a multi-host replica (`old`: its nodes, all ended), the old
    rows superseded in the same transaction: on `hosts` (the same hosts, one per node in rank
    order, already busy for it: each new row starts `provisioning` there), or with None placed
    anew by its node 0. Empty: somebody did it already."""
    with transaction.atomic():
        done = Job.objects.filter(pk__in=[j.pk for j in old], superseded=False, status__in=JOB_FINISHED) \
            .update(superseded=True, keep_host=False)
        if done != len(old):
            transaction.set_rollback(True)
            return []
        number = max(j.submission_num for j in old) + 1
        placed = hosts is not None
        fresh = Job.objects.bulk_create([
            Job(run=run, job_num=j.job_num, submission_num=number, node_group_name=j.node_group_name,
                node_group_index=j.node_group_index, node_group_rank=j.node_group_rank, replica_num=j.replica_num,
                deployment_num=j.deployment_num, spec=j.spec, fleet_id=j.fleet_id,
                status=JobStatus.PROVISIONING if placed else JobStatus.SUBMITTED,
                instance=hosts[i] if placed else None, waiting_master_job=not placed and j.node_group_rank != 0)
            for i, j in enumerate(old)])
        head = fresh[0]
        where = "on the same hosts" if hosts is not None else "looking for hosts"
        _say(run, head, f"replica {head.node_group_name}/{head.replica_num}, submission {number}: its "
                        f"{len(fresh)} nodes replace submission {number - 1} {where} ({why})")
        for row in fresh:
            if hosts is not None:
                messages.advance_job(row.pk)
        if hosts is None:
            messages.provision_job(head.pk)
    return fresh


def drain(job: Job, why: str, nodes: list[Job] = ()) -> bool:
    """Take a replica out of the endpoint's pool to remove it: a running one keeps running for the
    drain delay (the requests it serves finish) and is stopped then (keep.py); one not running yet
    serves nothing and is ended at once. `nodes`: the other nodes of a multi-host replica, which go
    with it (a replica is removed whole)."""
    done = _drain_one(job, why)
    for node in nodes:
        if not node.finished and node.drain_at is None:
            _drain_one(node, why)
    return done


def _drain_one(job: Job, why: str) -> bool:
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
