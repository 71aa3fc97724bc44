"""Moving instances between statuses: one conditional UPDATE and one INSERT of events per call.

As for jobs (runs/transitions.py), a status change and the event that says why are written
together, so an instance's history (`events/?run=NAME`, the admin) shows every hand-over: which
job took the host and when it was handed back (the event says "given back by job R/N").
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from events.services import record_many
from instances.models import Instance, InstanceStatus


def move_instances(instances: list[Instance], to: str, *, frm, message: str, actor: str = "server",
                   run_id=None, job_id=None, **fields) -> set[int]:
    """Move each of `instances` still in one of `frm` to `to`; returns the pks that moved.

    `instances` need `pk`, `project_id` and `name` (what the event names). Runs in the caller's
    transaction when there is one (no savepoint: a hand-over is part of the caller's move).
    """
    rows = {inst.pk: inst for inst in instances}
    if not rows:
        return set()
    now = timezone.now()
    with transaction.atomic(savepoint=False):
        touched = Instance.objects.filter(pk__in=rows, status__in=tuple(frm)).update(status=to, updated=now, **fields)
        moved = set(rows)
        if touched != len(rows):  # some moved on meanwhile: see which ones are ours now
            moved = set(Instance.objects.filter(pk__in=rows, status=to, updated=now).values_list("pk", flat=True))
        by_project: dict[int, list[dict]] = {}
        for pk in moved:
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


def taken_events(instances: list[Instance], job, message: str) -> list[dict]:
    """The events of hosts placement took for `job` (engine/submitted/placement.take_instances moved them
    idle -> busy in its own locked UPDATE), for record_many in the caller's transaction (the
    members' events of engine/submitted/fanout.place_members, one INSERT)."""
    return [{"subject": f"instance {inst.name}", "message": message, "status": InstanceStatus.BUSY,
             "instance_id": inst.pk, "run_id": job.run_id, "job_id": job.pk} for inst in instances]



def hand_back(instances: list[Instance], job=None, message: str = "") -> set[int]:
    """Busy hosts go back to idle (a job ended, or a placement that did not happen)."""
    who = f"job {job.run.name}/{job.job_num}" if job is not None else "the server"
    return move_instances(instances, InstanceStatus.IDLE, frm=[InstanceStatus.BUSY],
                          message=message or f"given back by {who}", run_id=job.run_id if job else None,
                          job_id=job.pk if job else None, idle_since=timezone.now())
