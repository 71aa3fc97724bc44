"""Reads of fleets and instance groups that the API and the engine both make."""

from __future__ import annotations

from instances.models import Fleet, GroupStatus, Instance, InstanceGroup
from runs.choices import JOB_UNFINISHED
from runs.models import Job


def find_group(project, name: str) -> InstanceGroup | None:
    """A group by its own name, or the group of the instance with that name."""
    group = InstanceGroup.objects.filter(project=project, name=name).exclude(status=GroupStatus.TERMINATED).first()
    if group is None:
        inst = Instance.objects.filter(project=project, name=name, group__isnull=False).select_related("group").first()
        if inst is not None and inst.group.status != GroupStatus.TERMINATED:
            group = inst.group
    return group


def group_in_use(group: InstanceGroup) -> bool:
    return Job.objects.filter(instance__group=group, status__in=JOB_UNFINISHED).exists()


def fleet_in_use(fleet: Fleet) -> bool:
    return Job.objects.filter(instance__fleet=fleet, status__in=JOB_UNFINISHED).exists()
