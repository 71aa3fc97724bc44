"""Restarting groups of a running run: their nodes get a new submission, the other groups run on.

Part of process_run (engine/processing.py), which holds the run, so every decision is written by one
worker at a time; `Run.restarts` keeps, per group, the restarts so far and the submission being
restarted. A restart goes in three passes of process_run, each safe to repeat:

1. decide: count the restart (or find the budget spent), set when it is due (the retry backoff);
   after an interruption the group moves to new hosts, and the groups that name its addresses
   (`${{ groups[i]... }}`) or `depends_on` it restart with it, on their own hosts;
2. stop: every active job of those groups is terminated; a job whose host the restart reuses
   keeps it busy when it ends (`Job.keep_host`, engine/finishing.py), so nobody else takes it;
3. start, once every job of the groups has ended and the backoff is over: in one transaction the
   old rows are marked superseded (conditionally: a second pass finds nothing to do) and the new
   rows written, on the kept hosts (`provisioning`) or waiting for new ones (`submitted`).

A worker killed in any pass leaves the run as the last committed pass left it; the sweep derives
it again (a job changed after its last derivation, or `next_retry_at` is past).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from engine import messages, outcome
from engine.failure_policy import (
    INTERRUPTION,
    event_of,
    group_of,
    is_replacement,
    max_restarts,
    referencing_groups,
)
from engine.submitted.waiting import hand_back
from events.services import record_many
from instances.models import Instance, InstanceStatus
from instances.transitions import move_instances
from runs.choices import JobReason, JobStatus
from runs.models import Job, Run
from runs.transitions import terminate_job


class Lost(Exception):
    """A host the restart meant to reuse is no longer free: this pass writes nothing."""


def backoff(count: int) -> timedelta:
    """The wait before restart number `count` (1, 2, ...): the run retry's steps (15 s doubling to 10 min)."""
    steps = settings.MUSTER["RETRY_BACKOFF"]
    return timedelta(seconds=steps[min(max(count - 1, 0), len(steps) - 1)])


def restart(run: Run, jobs: list[Job], causes: dict[int, Job]) -> None:
    """Move the groups of `causes` (group index -> the failure) one pass further (module docstring)."""
    records = {k: dict(v) for k, v in (run.restarts or {}).items()}
    now = timezone.now()
    current = {j.node_group_index: j.submission_num for j in jobs}
    for index, cause in sorted(causes.items()):
        _decide(run, records, index, cause, current, now)
    pending = {int(k): rec for k, rec in records.items() if rec.get("submission") == current.get(int(k))}
    still_active = 0
    for job in jobs:
        rec = pending.get(job.node_group_index)
        if rec is None or job.finished:
            continue
        still_active += 1
        if job.status != JobStatus.TERMINATING:
            terminate_job(job, JobReason.TERMINATED_BY_SERVER, f"restarting group {job.node_group_name}",
                          keep_host=not rec.get("new_hosts"))
    due = [datetime.fromisoformat(rec["due"]) for rec in pending.values()]
    if still_active or any(d > now for d in due):
        _save(run, records, min(due) if due else None)
        return
    try:
        with transaction.atomic():
            _start(run, jobs, pending, records)
    except Lost as lost:
        index = int(str(lost))
        records[str(index)]["new_hosts"] = True  # its addresses change: the groups that name them follow
        _cascade(run, records, index, current, now, datetime.fromisoformat(records[str(index)]["due"]))
        _save(run, records, now)
        messages.process_run(run.pk)


def _decide(run: Run, records: dict, index: int, cause: Job, current: dict, now) -> None:
    rec = records.get(str(index)) or {}
    if rec.get("submission") == cause.submission_num:
        return  # decided by an earlier pass
    count = int(rec.get("count", 0)) + 1
    replaced = is_replacement(cause)  # a slice of its set made again: no backoff, its creation is the wait
    wait = timedelta(0) if replaced else backoff(count)
    due = now + wait
    moves = event_of(cause) == INTERRUPTION and not replaced
    why = cause_text(cause) + (" (its slice is replaced)" if replaced else "")
    # `backoff` and `cause` are for readers (the API, `apply`, the console): why and when it restarts
    records[str(index)] = {"count": count, "submission": cause.submission_num, "due": due.isoformat(),
                           "new_hosts": moves, "backoff": wait.total_seconds(), "cause": why}
    group = cause.node_group_name
    where = "on new hosts" if moves else "on the same hosts"
    _say(run, f"group {group} restarts ({count} of {max_restarts(run, index)}) in {wait.total_seconds():.0f}s "
         f"{where}: {why} ({cause.termination_reason})")
    if moves or replaced:  # a replaced slice's hosts have new addresses
        _cascade(run, records, index, current, now, due)


def cause_text(job: Job) -> str:
    """"job 2 (workers/1) exited 3": the failure a restart is for, in the words a user looks for."""
    what = f"exited {job.exit_status}" if job.exit_status is not None else (job.termination_reason or "failed")
    return f"job {job.job_num} ({job.node_group_name}/{job.node_group_rank}) {what}"


def _cascade(run: Run, records: dict, index: int, current: dict, now, due) -> None:
    for other in sorted(referencing_groups(run, index)):
        rec = records.get(str(other)) or {}
        if rec.get("submission") == current.get(other):
            continue
        # not a failure of its own: the group's budget is not spent on it
        records[str(other)] = {"count": int(rec.get("count", 0)), "submission": current.get(other),
                               "due": due.isoformat(), "new_hosts": False, "follows": index,
                               "backoff": max(0.0, (due - now).total_seconds()),
                               "cause": f"it names the addresses of group {group_of(run, index).name or index}"}
        name = group_of(run, other).name or str(other)
        _say(run, f"group {name} restarts with group {index}: it names that group's addresses")


def _say(run: Run, message: str) -> None:
    """An event about the run, written with process_run's give-back (engine/outcome.py `learn`)."""
    outcome.learn(run, event=outcome.event(run.project_id, f"run {run.name}", message, status=run.status,
                                           run_id=run.pk))


def _save(run: Run, records: dict, next_at) -> None:
    outcome.learn(run, restarts=records, next_retry_at=next_at)  # written with process_run's give-back


def _start(run: Run, jobs: list[Job], pending: dict[int, dict], records: dict) -> None:
    fresh: list[Job] = []
    placed: list[tuple[Job, Instance]] = []
    for index, rec in sorted(pending.items()):
        old = [j for j in jobs if j.node_group_index == index]
        if not rec.get("new_hosts"):
            hosts = [reused_host(j, index) for j in old]
        else:
            kept = [j.instance for j in old if j.keep_host and j.instance is not None]
            hand_back(kept, None, f"given back: group {old[0].node_group_name} of run {run.name} moves",
                      project_id=run.project_id)
            hosts = [None] * len(old)
        touched = Job.objects.filter(pk__in=[j.pk for j in old], superseded=False).update(superseded=True,
                                                                                          keep_host=False)
        if touched != len(old):  # never while process_run holds the run: refuse rather than start twice
            raise RuntimeError(f"group {index} of run {run.name} was restarted by someone else")
        number = max(j.submission_num for j in old) + 1
        for j, host in zip(old, hosts, strict=True):
            row = Job(run=run, job_num=j.job_num, submission_num=number, node_group_name=j.node_group_name,
                      node_group_index=index, node_group_rank=j.node_group_rank, spec=j.spec,
                      status=JobStatus.PROVISIONING if host else JobStatus.SUBMITTED, instance=host,
                      waiting_master_job=host is None and j.node_group_rank != 0)
            fresh.append(row)
            if host is not None:
                placed.append((row, host))
        records[str(index)]["started"] = number
    Job.objects.bulk_create(fresh)
    top = max([run.submission_num, *(j.submission_num for j in fresh)])
    Run.objects.filter(pk=run.pk).update(restarts=records, next_retry_at=None, submission_num=top)
    run.restarts, run.next_retry_at, run.submission_num = records, None, top
    record_many(run.project_id, [
        {"subject": f"job {run.name}/{j.job_num}", "status": j.status, "run_id": run.pk, "job_id": j.pk,
         "instance_id": j.instance_id,
         "message": f"submission {j.submission_num}: restart of group {j.node_group_name}"
                    + (f" on {j.instance.name} ({j.instance.internal_ip})" if j.instance_id else ", looking for hosts")}
        for j in fresh])
    for row in fresh:
        if row.instance_id:
            messages.advance_job(row.pk)
        elif row.node_group_rank == 0:
            messages.provision_job(row.pk)


def reused_host(job: Job, index: int) -> Instance:
    """The job's own host for its successor: kept busy when it ended, or taken again if it went idle."""
    if job.instance is None:
        raise Lost(str(index))
    if job.keep_host and job.instance.status in (InstanceStatus.BUSY, InstanceStatus.PROVISIONING):
        return job.instance  # (provisioning: a slice being made again, engine/slice_replace.py)
    free = Instance.objects.filter(pk=job.instance_id, status=InstanceStatus.IDLE, unreachable=False).exists()
    if not free or not move_instances([job.instance], InstanceStatus.BUSY, frm=[InstanceStatus.IDLE],
                                      message=f"taken again by run {job.run.name} for the restart of group "
                                              f"{job.node_group_name}", run_id=job.run_id, job_id=job.pk,
                                      holder_id=job.run.project_id):
        raise Lost(str(index))
    return job.instance


def hand_back_kept(run: Run, jobs: list[Job] | None = None) -> None:
    """Hosts kept for a restart that is not going to happen (the run ends) go back to idle.

    `jobs`: the run's current jobs as the caller read them under the run's claim; none of them
    keeping its host (the usual end of a run) reads nothing more."""
    if jobs is not None and not any(j.keep_host for j in jobs):
        return
    for job in run.current_jobs().filter(keep_host=True).select_related("instance", "run"):
        with transaction.atomic():
            if Job.objects.filter(pk=job.pk, keep_host=True).update(keep_host=False) and job.instance_id:
                hand_back([job.instance], job)
