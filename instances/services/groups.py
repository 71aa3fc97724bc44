"""Deleting an instance group by its name (the API and the admin): validate, write, send a message.
The group's backend call and agent stops happen in the claimed step (engine/groups.py)."""

from __future__ import annotations

from django.db import transaction

from engine import messages
from instances.lookup import group_in_use
from instances.models import InstanceGroup
from instances.transitions import end_group
from muster.api_errors import InvalidInput
from runs.choices import JOB_ACTIVE, JobReason
from runs.models import Job
from runs.transitions import terminate_job


def delete_group(group: InstanceGroup, actor: str = "api", force: bool = False) -> None:
    """Delete the whole group (a TPU pod: one delete call); its instances all end terminated."""
    if group_in_use(group) and not force:
        raise InvalidInput(["name"], f"{group.name} runs a job: stop the run first (or delete with force=true)")
    with transaction.atomic():
        if force:
            for job in Job.objects.filter(instance__group=group, status__in=JOB_ACTIVE).select_related("run"):
                terminate_job(job, JobReason.TERMINATED_BY_SERVER, f"instance group {group.name} was deleted",
                              actor=actor)
        if end_group(group, actor=actor):
            messages.terminate_group(group.pk)
