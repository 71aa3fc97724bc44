"""Moving fleets, instance groups and instances between statuses: one conditional UPDATE and one
INSERT of events per call. Nothing else writes their `status` (tests/test_status_writes.py).

As for jobs (runs/transitions.py), a status change and the event that says why are written
together, so an instance's history (`events/?run=NAME`, the admin) shows every hand-over: which
job took the host and when it was handed back (the event says "given back by job R/N").
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from events.services import record, record_many, update_row_and_record
from instances.models import (
    LIVE_INSTANCE_STATUSES,
    Fleet,
    FleetStatus,
    GroupStatus,
    Instance,
    InstanceGroup,
    InstanceStatus,
)
from muster.claimable import Lease, guard_of, written_by

# every status a host leaves for `terminated` from: the `frm` of an end that takes any live host
NOT_TERMINATED = [status for status in InstanceStatus.values if status != InstanceStatus.TERMINATED]
# the statuses a host holds no job in: moving to one clears its holder (Instance.holder). A host
# being deleted (a TPU slice deleted or reclaimed) is nobody's any more, whether or not its job has
# ended yet: its job ends for it, and the job's hand_back moves only busy hosts
RELEASED = (InstanceStatus.IDLE, InstanceStatus.TERMINATING, InstanceStatus.TERMINATED)


def move_instances(instances: list[Instance], to: str, *, frm, message: str | None, actor: str = "server",
                   run_id=None, job_id=None, where: dict | None = None, **fields) -> set[int]:
    """Move each of `instances` still in one of `frm` (and matching `where`) to `to`; returns the
    pks that moved.

    `instances` need `pk`, `project_id` and `name` (what the event names). Runs in the caller's
    transaction when there is one (no savepoint: a hand-over is part of the caller's move).
    `message` None: the events are written by the caller's next call (taken_events, once the
    placement knows which job took the hosts), in the same transaction.
    """
    rows = {inst.pk: inst for inst in instances}
    if not rows:
        return set()
    if to in RELEASED:  # nobody's job is on it any more: it counts for no project (rows.held)
        fields.setdefault("holder_id", None)
    now = timezone.now()
    if len(rows) == 1 and message is not None:
        # one host (a job's, given back): the move and its event are one statement
        (pk, inst), = rows.items()
        moved = {pk} if update_row_and_record(
            Instance, pk, {"status__in": tuple(frm), **(where or {})},
            {"status": to, "updated": now, **fields}, inst.project_id, f"instance {inst.name}", message, status=to,
            actor=actor, run_id=run_id, job_id=job_id, instance_id=pk) else set()
        for key, value in {"status": to, **fields}.items() if moved else ():
            setattr(inst, key, value)
        return moved
    with transaction.atomic(savepoint=False):
        touched = Instance.objects.filter(pk__in=rows, status__in=tuple(frm), **(where or {})).update(
            status=to, updated=now, **fields)
        moved = set(rows)
        if touched != len(rows):  # some moved on meanwhile: see which ones are ours now
            moved = set(Instance.objects.filter(pk__in=rows, status=to, updated=now).values_list("pk", flat=True))
        by_project: dict[int, list[dict]] = {}
        for pk in moved if message is not None else ():
            inst = rows[pk]
            by_project.setdefault(inst.project_id, []).append(
                {"subject": f"instance {inst.name}", "message": message, "status": to, "instance_id": pk,
                 "run_id": run_id, "job_id": job_id})
        for project_id, entries in by_project.items():
            record_many(project_id, entries, actor=actor)
    for pk in moved:
        rows[pk].status = to
        for key, value in fields.items():
            setattr(rows[pk], key, value)
    return moved


def take_idle(instances: list[Instance], holder_id: int) -> bool:
    """Placement's idle -> busy of hosts it picked (and locked) for a job of project `holder_id`:
    all of them, or False when one moved on meanwhile (the caller rolls back). Their events come
    from taken_events, in the same transaction, once the job that took them is known."""
    if not instances:
        return True
    moved = move_instances(instances, InstanceStatus.BUSY, frm=[InstanceStatus.IDLE], message=None, idle_since=None,
                           holder_id=holder_id)
    return len(moved) == len(instances)


def taken_events(instances: list[Instance], job, message: str) -> list[dict]:
    """The events of hosts placement took for `job` (engine/submitted/placement.take_instances moved them
    idle -> busy in its own locked UPDATE), for record_many in the caller's transaction (the
    members' events of engine/submitted/fanout.place_members, one INSERT)."""
    return [{"subject": f"instance {inst.name}", "message": message, "status": InstanceStatus.BUSY,
             "instance_id": inst.pk, "run_id": job.run_id, "job_id": job.pk} for inst in instances]


def hand_back(instances: list[Instance], job=None, message: str = "") -> set[int]:
    """Busy hosts go back to idle (a job ended, or a placement that did not happen)."""
    if job is not None and any(inst.project_id != job.run.project_id for inst in instances):
        # a shared fleet's host (instances/shares.py): its owner's events never name another project's run
        job, message = None, "given back by another project's job"
    who = f"job {job.run.name}/{job.job_num}" if job is not None else "the server"
    return move_instances(instances, InstanceStatus.IDLE, frm=[InstanceStatus.BUSY],
                          message=message or f"given back by {who}", run_id=job.run_id if job else None,
                          job_id=job.pk if job else None, idle_since=timezone.now())


def _move_row(row, subject: str, to: str, frm, message: str, actor: str, where: dict | None, fields: dict,
              lease: Lease | None) -> bool:
    """One conditional UPDATE of `row` (still in `frm`, matching `where`, held by `lease`) and its event,
    in the caller's transaction when there is one; the caller's copy follows."""
    with transaction.atomic(savepoint=False):
        if not type(row).objects.filter(pk=row.pk, status__in=tuple(frm), **(where or {}), **guard_of(lease)).update(
                status=to, **written_by(lease), **fields):
            return False
        record(row.project_id, subject, message, status=to, actor=actor)
    row.status = to
    for key, value in fields.items():
        setattr(row, key, value)
    return True


def move_fleet(fleet: Fleet, to: str, *, frm, message: str, actor: str = "server", where: dict | None = None,
               lease: Lease | None = None, **fields) -> bool:
    """Move `fleet` to `to` if it is still in one of `frm` (and matches `where`; `lease`: as
    runs.transitions.move_job's, a registration holding the fleet), with its event; False when it was not."""
    return _move_row(fleet, f"fleet {fleet.name}", to, frm, message, actor, where, fields, lease)


def move_group(group: InstanceGroup, to: str, *, frm, message: str, actor: str = "server", where: dict | None = None,
               lease: Lease | None = None, **fields) -> bool:
    """Move `group` to `to` if it is still in one of `frm` (and matches `where`; `lease`: as
    runs.transitions.move_job's, a step holding the group), with its event; False when it was not."""
    return _move_row(group, f"instance group {group.name}", to, frm, message, actor, where, fields, lease)


def end_group(group: InstanceGroup, actor: str = "server", message: str = "deletion requested",
              lease: Lease | None = None) -> bool:
    """Mark a live group and its live instances terminating; False when it was ending already.

    Sends nothing: the caller sends terminate_group (engine/groups.py), or returns it in its
    step's Outcome when the caller holds the group (a message sent now would bounce off the lease).
    """
    with transaction.atomic(savepoint=False):
        if not move_group(group, GroupStatus.TERMINATING, frm=[GroupStatus.PROVISIONING, GroupStatus.ACTIVE],
                          message=message, actor=actor, lease=lease):
            return False
        move_instances(list(group.instances.filter(status__in=LIVE_INSTANCE_STATUSES)), InstanceStatus.TERMINATING,
                       frm=LIVE_INSTANCE_STATUSES, message="deleting with its group", actor=actor)
    return True


def remove_fleet(fleet: Fleet, *, lease: Lease, actor: str = "server") -> bool:
    """The last move of a fleet's deletion (engine/fleet_deletion.py): the terminating row goes, with
    its event, only while the step still holds it (`lease`); False when the lease was lost."""
    with transaction.atomic(savepoint=False):
        _, gone = Fleet.objects.filter(pk=fleet.pk, status=FleetStatus.TERMINATING, **lease.guard()).delete()
        if not gone.get(Fleet._meta.label):
            return False
        record(fleet.project_id, f"fleet {fleet.name}", "deleted", actor=actor)
    return True
