"""Moving jobs and runs between statuses: one conditional update, one event, one nudge."""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial

from django.db import connection, connections, router, transaction
from django.db.models import Case, Exists, F, OuterRef, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from engine import messages
from events.models import Event
from events.services import record_many, update_row_and_record
from instances.transitions import taken_events
from muster import compiled
from muster.claimable import Lease, guard_of, written_by
from runs.choices import (
    FAILING_REASONS,
    FINAL_STATUS,
    JOB_ACTIVE,
    JOB_FINISHED,
    JOB_UNFINISHED,
    RUN_FINISHED,
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


def ended_without_failure(status: str, reason: str) -> bool:
    return status in JOB_FINISHED and status != JobStatus.FAILED and reason not in FAILING_REASONS


def matters_only_last(job: Job, to: str, reason: str) -> bool:
    """Whether a job ending in `to` can change its run only if no other current job of the run is
    still unfinished: it ended without a failure, so process_run acts once all have ended (the run
    done, or its teardown over). Not so for the master of a `stop_criteria: master-done` run, nor
    while a group of the run restarts (its end starts the next pass while other groups run on); a
    stale `job.run` there only costs a nudge the sweep would send anyway
    (process_run's `_derive_again_if_moved` and the sweep's routine derive)."""
    if not ended_without_failure(to, reason):
        return False
    run = job.run
    if run.restarts:
        return False
    return not (job.job_num == 0 and (run.configuration or {}).get("stop_criteria") == "master-done")


# the run, if it is still unfinished and none of its current jobs is: compiled once (muster/compiled.py)
_DERIVE_DUE = compiled.Select(lambda run_id: Run.objects.filter(pk=run_id).exclude(status__in=RUN_FINISHED).exclude(
    Exists(Job.objects.filter(run_id=OuterRef("pk"), superseded=False, status__in=JOB_UNFINISHED))).values("pk"), int)


def derive_due(run_id: int, run: Run | None = None) -> bool:
    """Whether every current job of the run has ended while the run itself has not: one short read,
    after its caller's commit. A run already finished needs no derive: process_run could not claim
    it (the jobs a teardown ends in the step that then finishes the run would each nudge for nothing).
    `run`: the caller's copy; one it saw finish (in the transaction that just committed) is not read."""
    if run is not None and run.status in RUN_FINISHED:
        return False
    sql, params = _DERIVE_DUE.statement(run_id)
    with connections[router.db_for_read(Job)].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() is not None


def move_job(job: Job, to: str, *, frm=None, message: str = "", actor: str = "server", lease: Lease | None = None,
             **fields) -> bool:
    """Move `job` to status `to` if it is still in one of `frm` (default: its current status).

    `lease`: the step holding the job (muster.claimable.Lease): the UPDATE is guarded by its token
    too, and when the move is the step's give-back (an Outcome's `move`) it clears the lease in the
    same statement.
    """
    frm = tuple(frm) if frm else (job.status,)
    now = timezone.now()
    held, freed = guard_of(lease), written_by(lease)
    reason = fields.get("termination_reason", "")
    starts_run = to == JobStatus.RUNNING and job.run.status in (RunStatus.SUBMITTED, RunStatus.PROVISIONING)
    ends = _ends(to, now, fields)
    # The move and its event are one statement on PostgreSQL (update_and_record), atomic on its own;
    # a transaction only when the run moves with it. The caller's when there is one, without a
    # savepoint (two statements less): an error in here ends the caller's transaction anyway, as
    # it does move_instances'.
    with transaction.atomic(savepoint=False) if starts_run else nullcontext():
        touched = update_row_and_record(
            Job, job.pk, {"status__in": frm, **held},
            {"status": to, "status_changed_at": now, **freed, **fields, **ends},
            job.run.project_id, f"job {job.run.name}/{job.job_num}", message or (f"{to} ({reason})" if reason else to),
            status=to, actor=actor, run_id=job.run_id, job_id=job.pk,
            instance_id=fields.get("instance_id", job.instance_id))
        if touched != 1:
            return False
        if starts_run:
            # what process_run would derive from it, without a task: the first running job runs the run
            move_run(job.run, RunStatus.RUNNING, frm=[RunStatus.SUBMITTED, RunStatus.PROVISIONING])
        elif may_change_run(job, to, fields.get("termination_reason", "")):
            _nudge_run(job, to, fields.get("termination_reason") or job.termination_reason)
    job.status = to
    job.status_changed_at = now
    for key, value in fields.items():
        setattr(job, key, value)
    if ends and job.end_time is None:
        job.end_time = now.timestamp()
    return True


def _ends(to: str, now, fields: dict) -> dict:
    """The end time a job entering a finished status gets: the runner's when it reported one (the row
    keeps it), else now. Without it a job the server or a user stopped never ended, and its run
    time grew for ever (console, API)."""
    if to not in JOB_FINISHED or "end_time" in fields:
        return {}
    return {"end_time": Coalesce(F("end_time"), Value(now.timestamp()))}


def _nudge_run(job: Job, to: str, reason: str) -> None:
    if matters_only_last(job, to, reason):
        messages.process_run_if(job.run_id, partial(derive_due, job.run_id, job.run))
    else:
        messages.process_run(job.run_id)


def end_unstarted_jobs(jobs: list[Job], reason: str, actor: str = "server") -> list[Job]:
    """Jobs of one run that never started anywhere (`submitted`), ended for `reason` at once: on
    PostgreSQL one statement for their moves and their events however many there are (a 300-node
    run that found no capacity is not 299 UPDATEs). Guarded by `submitted`, so one placed or
    stopped meanwhile does not move. Returns the jobs moved; the caller's copies move too."""
    if not jobs:
        return []
    if connection.vendor != "postgresql" or len(jobs) == 1:
        return [j for j in jobs if move_job(j, FINAL_STATUS[reason], frm=[JobStatus.SUBMITTED],
                                            termination_reason=reason, actor=actor)]
    run, to, now = jobs[0].run, FINAL_STATUS[reason], timezone.now()
    job_table, event_table = (connection.ops.quote_name(m._meta.db_table) for m in (Job, Event))
    with connection.cursor() as cursor:
        # the UPDATE's RETURNING feeds the events' INSERT, whose RETURNING says which jobs moved
        cursor.execute(
            f"WITH moved AS (UPDATE {job_table} SET status = %s, status_changed_at = %s, termination_reason = %s, "
            f"end_time = COALESCE(end_time, %s) WHERE id = ANY(%s) AND status = %s RETURNING id, job_num, instance_id) "
            f"INSERT INTO {event_table} (project_id, subject, message, status, actor, run_id, job_id, instance_id, "
            f"created) SELECT %s, %s || moved.job_num, %s, %s, %s, %s, moved.id, moved.instance_id, %s FROM moved "
            f"RETURNING job_id",
            [to, now, reason, now.timestamp(), [j.pk for j in jobs], JobStatus.SUBMITTED,
             run.project_id, f"job {run.name}/", f"{to} ({reason})", to, actor, run.pk, now])
        moved_ids = {row[0] for row in cursor.fetchall()}
    moved = [j for j in jobs if j.pk in moved_ids]
    for job in moved:
        job.status, job.status_changed_at, job.termination_reason = to, now, reason
        job.end_time = now.timestamp() if job.end_time is None else job.end_time
    if moved and may_change_run(moved[0], to, reason):  # the one nudge move_job would send for each
        if all(matters_only_last(j, to, reason) for j in moved):
            messages.process_run_if(run.pk, partial(derive_due, run.pk, run))
        else:
            messages.process_run(run.pk)
    return moved


def end_job(job: Job, reason: str, message: str = "", actor: str = "server", lease: Lease | None = None,
            **fields) -> bool:
    """Move an active job towards its end with `reason`, and send nothing: to `terminating` (its
    stop is finish_job's, engine/finishing.py), or straight to its final status when nothing of it
    runs anywhere and no host is held. A step holding the job calls this; its Outcome sends the
    finish_job (a message sent now would bounce off the step's own lease)."""
    if job.instance_id is None and not job.runner_submitted:
        return move_job(job, FINAL_STATUS.get(reason, JobStatus.TERMINATED), frm=JOB_ACTIVE, termination_reason=reason,
                        termination_message=message, message=message, actor=actor, lease=lease, **fields)
    return move_job(job, JobStatus.TERMINATING, frm=JOB_ACTIVE, termination_reason=reason,
                    termination_message=message, message=message or f"terminating ({reason})", actor=actor,
                    lease=lease, **fields)


def terminate_job(job: Job, reason: str, message: str = "", actor: str = "server", **fields) -> bool:
    """Ask an active job nobody holds to end with `reason` (end_job), and send its finish_job."""
    moved = end_job(job, reason, message, actor, **fields)
    if moved and job.status == JobStatus.TERMINATING:
        messages.finish_job(job.pk)
    return moved


def move_run(run: Run, to: str, *, frm=None, message: str = "", actor: str = "server", lease: Lease | None = None,
             **fields) -> bool:
    """Move `run` to `to` if it is still in one of `frm`; `lease`: as move_job's (process_run holds the run)."""
    frm = tuple(frm) if frm else (run.status,)
    if to in (RunStatus.DONE, RunStatus.FAILED, RunStatus.TERMINATED):
        fields.setdefault("finished_at", timezone.now())
    now = timezone.now()
    # the first start only: the row's own value wins over this one, whatever this copy of the run holds
    first_start = {"started_at": Coalesce(F("started_at"), Value(now))} if to == RunStatus.RUNNING else {}
    reason = fields.get("termination_reason", "")
    # as in move_job: the move and its event in one statement on PostgreSQL
    touched = update_row_and_record(Run, run.pk, {"status__in": frm, **guard_of(lease)},
                                    {"status": to, "updated": now, **first_start, **written_by(lease), **fields},
                                    run.project_id,
                                    f"run {run.name}", message or (f"{to} ({reason})" if reason else to), status=to,
                                    actor=actor, run_id=run.pk)
    if touched != 1:
        return False
    if first_start and run.started_at is None:
        run.started_at = now
    run.status = to
    for key, value in fields.items():
        setattr(run, key, value)
    return True


def request_stop(run: Run, abort: bool = False, actor: str = "user") -> None:
    """User stop/abort: works at any stage; process_run (engine/processing.py) does the rest."""
    if run.finished:
        return
    kind = StopRequest.ABORT if abort else StopRequest.STOP
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).exclude(stop_requested=StopRequest.ABORT).update(stop_requested=kind)
        if run.status == RunStatus.PENDING:
            move_run(run, RunStatus.TERMINATED, termination_reason=RunReason.ABORTED_BY_USER if abort else RunReason.STOPPED_BY_USER,
                     actor=actor, message=f"{kind}ped by {actor} while waiting to retry")
        messages.process_run(run.pk)


def place_on_hosts(master: Job, members: list[Job], pairs: dict, hosts: list[dict], taken: str = "") -> set[int]:
    """Waiting members of `master`'s group, each given its host (`pairs`: member pk -> instance)
    and moved to provisioning: one UPDATE and one INSERT of events, however large the group.
    `hosts`: events already due (the master's own taken host); with `taken`, the placed members'
    hosts' events join them in that same INSERT. Returns the pks placed (a member stopped
    meanwhile is not); the caller's copies move too."""
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
    if taken:
        hosts = hosts + taken_events([pairs[m.pk] for m in members if m.pk in placed], master, taken)
    if placed or hosts:
        run = master.run
        record_many(run.project_id, [
            {"subject": f"job {run.name}/{member.job_num}", "status": JobStatus.PROVISIONING, "run_id": run.pk,
             "job_id": member.pk, "instance_id": pairs[member.pk].pk,
             "message": f"provisioning on {pairs[member.pk].name} ({pairs[member.pk].internal_ip}), "
                        f"placed by job {master.job_num} with its group"}
            for member in members if member.pk in placed] + hosts)
    return placed
