"""Moving jobs and runs between statuses: one conditional update, one event, one nudge."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from engine import messages
from events.services import record, record_many
from runs.choices import (
    FAILING_REASONS,
    FINAL_STATUS,
    JOB_ACTIVE,
    JOB_FINISHED,
    JobStatus,
    RunReason,
    RunStatus,
    StopRequest,
)
from runs.models import Job, Run


def may_change_run(job: Job, to: str, reason: str) -> bool:
    """Whether a job entering `to` can change what process_run derives for its run.

    Most moves cannot (pulling; running, which move_job applies to the run itself; terminating
    because the runner finished or a stop is under way), and a process_run for them is a task and a
    handful of statements per job for nothing. A stale `job.run.status` only costs an extra nudge;
    the sweep re-derives any run left unchanged.
    """
    if to in JOB_FINISHED:
        return True
    if to == JobStatus.TERMINATING:
        return reason in FAILING_REASONS
    if to == JobStatus.PROVISIONING:
        return job.run.status == RunStatus.SUBMITTED
    return False


def move_job(job: Job, to: str, *, frm=None, message: str = "", actor: str = "server", **fields) -> bool:
    """Move `job` to status `to` if it is still in one of `frm` (default: its current status)."""
    frm = tuple(frm) if frm else (job.status,)
    now = timezone.now()
    with transaction.atomic():
        touched = Job.objects.filter(pk=job.pk, status__in=frm).update(status=to, status_changed_at=now, **fields)
        if touched != 1:
            return False
        reason = fields.get("termination_reason", "")
        text = message or (f"{to} ({reason})" if reason else to)
        record(job.run.project_id, f"job {job.run.name}/{job.job_num}", text, status=to, actor=actor,
               run_id=job.run_id, job_id=job.pk, instance_id=fields.get("instance_id", job.instance_id))
        if to == JobStatus.RUNNING and job.run.status in (RunStatus.SUBMITTED, RunStatus.PROVISIONING):
            # what process_run would derive from it, without a task: the first running job runs the run
            move_run(job.run, RunStatus.RUNNING, frm=[RunStatus.SUBMITTED, RunStatus.PROVISIONING])
        elif may_change_run(job, to, fields.get("termination_reason", "")):
            messages.derive_run(job.run_id)
    job.status = to
    job.status_changed_at = now
    for key, value in fields.items():
        setattr(job, key, value)
    return True


def terminate_job(job: Job, reason: str, message: str = "", actor: str = "server", held: bool = False,
                  **fields) -> bool:
    """Ask an active job to end with `reason`; the stop itself happens in engine.stopping.

    `held`: the caller holds the job's lease, so finish_job could not claim it yet; the caller hands
    the job over when it lets go (engine.job_leases.release_job) instead of a message being sent now for nothing.
    """
    if job.instance_id is None and not job.runner_submitted:
        # nothing runs anywhere and no host is held: end it now instead of via finish_job
        return move_job(job, FINAL_STATUS.get(reason, JobStatus.TERMINATED), frm=JOB_ACTIVE, termination_reason=reason,
                        termination_message=message, message=message, actor=actor, **fields)
    moved = move_job(job, JobStatus.TERMINATING, frm=JOB_ACTIVE, termination_reason=reason,
                     termination_message=message, message=message or f"terminating ({reason})", actor=actor,
                     **fields)
    if moved and not held:
        messages.finish_job(job.pk)
    return moved


def move_run(run: Run, to: str, *, frm=None, message: str = "", actor: str = "server", **fields) -> bool:
    frm = tuple(frm) if frm else (run.status,)
    if to in (RunStatus.DONE, RunStatus.FAILED, RunStatus.TERMINATED):
        fields.setdefault("finished_at", timezone.now())
    now = timezone.now()
    # the first start only: the row's own value wins over this one, whatever this copy of the run holds
    first_start = {"started_at": Coalesce(F("started_at"), Value(now))} if to == RunStatus.RUNNING else {}
    with transaction.atomic():
        touched = Run.objects.filter(pk=run.pk, status__in=frm).update(status=to, updated=now, **first_start,
                                                                       **fields)
        if touched != 1:
            return False
        reason = fields.get("termination_reason", "")
        record(run.project_id, f"run {run.name}", message or (f"{to} ({reason})" if reason else to), status=to,
               actor=actor, run_id=run.pk)
    if first_start and run.started_at is None:
        run.started_at = now
    run.status = to
    for key, value in fields.items():
        setattr(run, key, value)
    return True


def request_stop(run: Run, abort: bool = False, actor: str = "user") -> None:
    """User stop/abort: works at any stage; process_run (engine/deriving.py) does the rest."""
    if run.finished:
        return
    kind = StopRequest.ABORT if abort else StopRequest.STOP
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).exclude(stop_requested=StopRequest.ABORT).update(stop_requested=kind)
        if run.status == RunStatus.PENDING:
            move_run(run, RunStatus.TERMINATED, termination_reason=RunReason.ABORTED_BY_USER if abort else RunReason.STOPPED_BY_USER,
                     actor=actor, message=f"{kind}ped by {actor} while waiting to retry")
        messages.derive_run(run.pk)


def place_on_hosts(master: Job, members: list[Job], pairs: dict) -> set[int]:
    """Waiting members of `master`'s group, each given its host (`pairs`: member pk -> instance)
    and moved to provisioning: one UPDATE and one INSERT of events, however large the group.
    Returns the pks placed (a member stopped meanwhile is not); the caller's copies move too."""
    touched = Job.objects.filter(pk__in=pairs, status=JobStatus.SUBMITTED, instance__isnull=True).update(
        instance_id=Case(*[When(pk=pk, then=Value(instance.pk)) for pk, instance in pairs.items()]),
        status=JobStatus.PROVISIONING, waiting_master_job=False, status_changed_at=timezone.now())
    placed = set(pairs)
    if touched != len(pairs):  # some member was stopped meanwhile: see which ones got their host
        placed = {pk for pk, instance_id in Job.objects.filter(pk__in=pairs).values_list("pk", "instance_id")
                  if instance_id == pairs[pk].pk}
    for member in members:
        if member.pk in placed:  # the caller's copies too: the fan-out that follows must not release them
            member.status, member.instance_id, member.waiting_master_job = JobStatus.PROVISIONING, pairs[member.pk].pk, False
    if placed:
        run = master.run
        record_many(run.project_id, [
            {"subject": f"job {run.name}/{member.job_num}", "status": JobStatus.PROVISIONING, "run_id": run.pk,
             "job_id": member.pk, "instance_id": pairs[member.pk].pk,
             "message": f"provisioning on {pairs[member.pk].name} ({pairs[member.pk].internal_ip}), "
                        f"placed by job {master.job_num} with its group"}
            for member in members if member.pk in placed])
    return placed
