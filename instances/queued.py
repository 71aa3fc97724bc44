"""What a group's queued request (a TPU pod's queued resource) says while it waits: the view the API,
CLI and console show, as the group's backend reads it (backends/base.py: Compute.queued_view)."""

from __future__ import annotations

from backends.registry import compute_class, group_backend
from instances.models import Instance, InstanceGroup, InstanceStatus


def queued_view(group: InstanceGroup) -> dict | None:
    """Where a pod's queued resource stands ({name, zone, state, since}); None for a direct create."""
    return compute_class(group_backend(group)).queued_view(group.backend_data)


def queued_message(view: dict | None, now: float) -> str:
    """"queued in us-east5-a: WAITING_FOR_RESOURCES for 12 min" while the request waits."""
    if not view or not view["state"] or view["state"] == "ACTIVE" or not view["zone"]:
        return ""
    minutes = int((now - (view["since"] or now)) // 60)
    return f"queued in {view['zone']}: {view['state']} for {minutes} min"


def waits_in_queue(instance: Instance | None) -> bool:
    """A host of a pod still being made from a queued request (whose poll bounds the wait)."""
    if instance is None or instance.group_id is None or instance.status != InstanceStatus.PROVISIONING:
        return False
    return queued_view(instance.group) is not None
