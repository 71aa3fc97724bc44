"""What a TPU pod's queued resource says while it waits: the view the API, CLI and console show."""

from __future__ import annotations

from instances.models import Instance, InstanceGroup, InstanceStatus


def queued_view(group: InstanceGroup) -> dict | None:
    """Where a pod's queued resource stands ({name, zone, state, since}); None for a direct create."""
    create = group.backend_data.get("create") or {}
    if not create.get("queued"):
        return None
    return {"name": group.backend_data.get("queued_resource", ""), "zone": create.get("zone", ""),
            "state": create.get("qr_state", ""), "since": create.get("since")}


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
    return bool((instance.group.backend_data.get("create") or {}).get("queued"))
