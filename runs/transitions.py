"""Moving jobs and runs between statuses: one conditional update, one event, one nudge."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Case, DurationField, F, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from engine import messages, nudges
from events.services import record_each, record_many, update_row_and_record
from instances.transitions import taken_events
from muster.claimable import Lease, guard_of, written_by
from runs import rows
from runs.choices import (
    FINAL_STATUS,
    JOB_ACTIVE,
    JOB_FINISHED,
    JobStatus,
    RunReason,
    RunStatus,
    StopRequest,
)
from runs.models import Job, Run


def move_job(job: Job, to: str, *, frm=None, message: str = "", actor: str = "server", lease: Lease | None = None,
             where: dict | None = None, **fields) -> bool:
    """Move `job` to status `to` if it is still in one of `frm` (default: its current status).

    `lease`: the step holding the job (muster.claimable.Lease): the UPDATE is guarded by its token
    too, and when the move is the step's give-back (an Outcome's `move`) it clears the lease in the
    same statement.
    `where`: more guards of the UPDATE (filter lookups), for a field another step writes without
    the job's lease (a replica's drain_at, written by process_run): the copy may not show it yet.
    """
    frm = tuple(frm) if frm else (job.status,)
    now = timezone.now()
    held, freed = guard_of(lease), written_by(lease)
    reason = fields.get("termination_reason", "")
    starts_run = to == JobStatus.RUNNING and job.run.status in (RunStatus.SUBMITTED, RunStatus.PROVISIONING)
    ends = _ends(to, now, fields)
    routes = nudges.routes_change(job, to, fields)  # a service's ready set: the endpoints are told in here
    # The move and its event are one statement on PostgreSQL (update_and_record), atomic on its own;
    # a transaction only when the run moves with it or the endpoints are told. The caller's when there
    # is one, without a savepoint (two statements less): an error in here ends the caller's
    # transaction anyway, as it does move_instances'.
    with transaction.atomic(savepoint=False) if starts_run or routes else nullcontext():
        touched = update_row_and_record(
            Job, job.pk, {"status__in": frm, **held, **(where or {})},
            {"status": to, "status_changed_at": now, **freed, **fields, **ends},
            job.run.project_id, f"job {job.run.name}/{job.job_num}", message or (f"{to} ({reason})" if reason else to),
            status=to, actor=actor, run_id=job.run_id, job_id=job.pk,
            instance_id=fields.get("instance_id", job.instance_id))
        if touched != 1:
            return False
        if routes:
            nudges.routes_moved(job)
        if starts_run:
            # what process_run would derive from it, without a task: the first running job runs the run
            move_run(job.run, RunStatus.RUNNING, frm=[RunStatus.SUBMITTED, RunStatus.PROVISIONING])
        else:
            nudges.job_moved(job, to, fields.get("termination_reason", ""),
                             fields.get("termination_reason") or job.termination_reason)
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


def end_unstarted_jobs(jobs: list[Job], reason: str, actor: str = "server") -> list[Job]:
    """Jobs of one run that never started anywhere (`submitted`), ended for `reason` at once: on
    PostgreSQL one statement for their moves and their events however many there are (a 300-node
    run that found no capacity is not 299 UPDATEs). Guarded by `submitted`, so one placed or
    stopped meanwhile does not move. Returns the jobs moved; the caller's copies move too."""
    if not jobs:
        return []
    if not rows.ends_in_one(connection, len(jobs)):
        return [j for j in jobs if move_job(j, FINAL_STATUS[reason], frm=[JobStatus.SUBMITTED],
                                            termination_reason=reason, actor=actor)]
    run, to, now = jobs[0].run, FINAL_STATUS[reason], timezone.now()
    moved_ids = rows.end_unstarted(run, [j.pk for j in jobs], to, reason, actor, now)
    moved = [j for j in jobs if j.pk in moved_ids]
    for job in moved:
        job.status, job.status_changed_at, job.termination_reason = to, now, reason
        job.end_time = now.timestamp() if job.end_time is None else job.end_time
    nudges.jobs_moved(run, moved, to, reason)  # the one nudge move_job would send for each
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
    routes = nudges.run_routes_end(run, to)  # a service leaving the endpoint: told in the move's transaction
    # as in move_job: the move and its event in one statement on PostgreSQL
    with transaction.atomic(savepoint=False) if routes else nullcontext():
        touched = update_row_and_record(Run, run.pk, {"status__in": frm, **guard_of(lease)},
                                        {"status": to, "updated": now, **first_start, **written_by(lease), **fields},
                                        run.project_id,
                                        f"run {run.name}", message or (f"{to} ({reason})" if reason else to),
                                        status=to, actor=actor, run_id=run.pk)
        if touched == 1 and routes:
            nudges.routes_ended(run)
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


def place_runs(fleet, placements: list[tuple[Job, list[Job], list]], lease: Lease) -> Callable[[], None] | None:
    """Runs of one group, waiting for hosts, placed together on `fleet` by one step (the fleet's
    admission look, engine/submitted/together.py): `placements` is (job 0, the rest of its group,
    their hosts with job 0's first) each. Each run submitted -> provisioning on the fleet; its job 0
    (held by `lease`) and the rest of its group submitted -> provisioning on their hosts, job 0's
    wait ended; with the events move_run, move_job, place_on_hosts and taken_events would write. In
    the caller's transaction: one UPDATE of the runs, one of the jobs and one INSERT however many.
    All or nothing: None when a run or a job moved on meanwhile (a stop), for the caller to roll
    back; else the move of the caller's copies, for the caller to make once the transaction has
    committed (a commit that fails leaves them as the rows are)."""
    now = timezone.now()
    runs = [job.run for job, _, _ in placements]
    if Run.objects.filter(pk__in=[r.pk for r in runs], status=RunStatus.SUBMITTED, fleet__isnull=True,
                          stop_requested="").update(status=RunStatus.PROVISIONING, updated=now, fleet=fleet) != len(runs):
        return None
    waited = {job.pk: max(now - job.created, timedelta(0)) for job, _, _ in placements}
    hosts = {j.pk: inst for job, rest, insts in placements for j, inst in zip([job, *rest], insts, strict=True)}
    members = [m.pk for _, rest, _ in placements for m in rest]
    if Job.objects.filter(Q(pk__in=waited, **guard_of(lease)) | Q(pk__in=members), status=JobStatus.SUBMITTED,
                          instance__isnull=True).update(
            status=JobStatus.PROVISIONING, status_changed_at=now, fleet=fleet, waiting_master_job=False,
            waiting_for="", next_check_at=None, waiting_fleet_id=None,
            instance_id=Case(*[When(pk=pk, then=Value(inst.pk)) for pk, inst in hosts.items()]),
            host_wait=Case(*[When(pk=pk, then=Value(wait)) for pk, wait in waited.items()], default=F("host_wait"),
                           output_field=DurationField())) != len(hosts):
        return None
    events = []
    for job, rest, insts in placements:
        run, mine = job.run, insts[0]
        taken = f"taken by job {run.name}/{job.job_num} for its group {job.node_group_name}"
        events += [(run.project_id, {"subject": f"run {run.name}", "message": f"placed on fleet {fleet.name}",
                                     "status": RunStatus.PROVISIONING, "run_id": run.pk}),
                   (run.project_id, {"subject": f"job {run.name}/{job.job_num}", "status": JobStatus.PROVISIONING,
                                     "message": f"provisioning on {mine.name} ({mine.internal_ip})",
                                     "run_id": run.pk, "job_id": job.pk, "instance_id": mine.pk}),
                   *((run.project_id, {"subject": f"job {run.name}/{m.job_num}", "status": JobStatus.PROVISIONING,
                                       "message": f"provisioning on {inst.name} ({inst.internal_ip}), placed by job "
                                                  f"{job.job_num} with its group",
                                       "run_id": run.pk, "job_id": m.pk, "instance_id": inst.pk})
                     for m, inst in zip(rest, insts[1:], strict=True)),
                   *((run.project_id, e) for e in taken_events(insts, job, taken))]
    record_each(events)

    def copies() -> None:
        for job, rest, insts in placements:
            job.run.status, job.run.fleet = RunStatus.PROVISIONING, fleet
            for j, inst in zip([job, *rest], insts, strict=True):
                j.status, j.status_changed_at, j.fleet, j.instance = JobStatus.PROVISIONING, now, fleet, inst
                j.waiting_master_job = False
            job.waiting_for, job.next_check_at, job.waiting_fleet_id, job.host_wait = "", None, None, waited[job.pk]
    return copies


def place_on_hosts(master: Job, members: list[Job], pairs: dict, hosts: list[dict], taken: str = "") -> set[int]:
    """Waiting members of `master`'s group, each given its host (`pairs`: member pk -> instance)
    and moved to provisioning: one statement on PostgreSQL (runs/rows.place: the UPDATE and the
    events' INSERT in one WITH, its text written once, where the ORM built a CASE per member and a
    bulk INSERT on every placement), elsewhere one UPDATE and one INSERT; however large the group.
    `hosts`: events already due (the master's own taken host); with `taken`, the placed members'
    hosts' events join them in that same INSERT. Returns the pks placed (a member stopped
    meanwhile is not); the caller's copies move too."""
    run = master.run
    if rows.with_returning(connection):  # the UPDATE and every event in one statement, written once
        return _placed(members, pairs, rows.place(
            run.project_id, {pk: inst.pk for pk, inst in pairs.items()}, JobStatus.PROVISIONING,
            JobStatus.SUBMITTED, timezone.now(), [*((m.pk, e) for m, e in _member_events(run, master, members, pairs)),
                                                 *((None, e) for e in hosts),
                                                 *((m.pk, e) for m in members
                                                   for e in (taken_events([pairs[m.pk]], master, taken) if taken
                                                             else ()))]))
    touched = Job.objects.filter(pk__in=pairs, status=JobStatus.SUBMITTED, instance__isnull=True).update(
        instance_id=Case(*[When(pk=pk, then=Value(instance.pk)) for pk, instance in pairs.items()]),
        status=JobStatus.PROVISIONING, waiting_master_job=False, status_changed_at=timezone.now())
    placed = set(pairs)
    if touched != len(pairs):  # some member was stopped meanwhile: see which ones got their host
        placed = {pk for pk, instance_id in Job.objects.filter(pk__in=pairs).values_list("pk", "instance_id")
                  if instance_id == pairs[pk].pk}
    _placed(members, pairs, placed)
    if taken:
        hosts = hosts + taken_events([pairs[m.pk] for m in members if m.pk in placed], master, taken)
    if placed or hosts:
        record_many(run.project_id, [e for m, e in _member_events(run, master, members, pairs) if m.pk in placed]
                    + hosts)
    return placed


def _placed(members: list[Job], pairs: dict, placed: set[int]) -> set[int]:
    """The caller's copies of the placed members move too: the fan-out that follows must not release them."""
    for member in members:
        if member.pk in placed:
            member.status, member.instance_id, member.waiting_master_job = JobStatus.PROVISIONING, pairs[member.pk].pk, False
    return placed


def _member_events(run: Run, master: Job, members: list[Job], pairs: dict) -> list[tuple[Job, dict]]:
    return [(member, {"subject": f"job {run.name}/{member.job_num}", "status": JobStatus.PROVISIONING, "run_id": run.pk,
                      "job_id": member.pk, "instance_id": pairs[member.pk].pk,
                      "message": f"provisioning on {pairs[member.pk].name} ({pairs[member.pk].internal_ip}), "
                                 f"placed by job {master.job_num} with its group"}) for member in members]
