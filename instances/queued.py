"""What a group's queued request (a TPU pod's queued resource) says while it waits: the view the API,
CLI and console show, as the group's backend reads it (backends/base.py: Compute.queued_view); and
what a plan says before a run goes to a fleet that asks Google for queued resources: how long a
flex-start slice is given for, and that a queued set is not replaced slice by slice."""

from __future__ import annotations

from backends.registry import compute_class, group_backend
from instances.models import Fleet, Instance, InstanceGroup, InstanceStatus
from runs.configuration.fleet_written import FLEX_START


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


def flex_start_duration(fleet: Fleet) -> int | None:
    """A flex-start fleet's `max_run_duration` (seconds): Google reclaims each slice it is given at
    most that long after giving it (docs/tpu.md, "Flex-start"); None for any other fleet."""
    queued = (fleet.configuration or {}).get("queued_resource")
    if not isinstance(queued, dict) or queued.get("provisioning_model") != FLEX_START:
        return None
    return queued.get("max_run_duration")


def flex_start_deadlines(groups: list[str], fleets: list[Fleet]) -> dict[str, dict]:
    """The plan's `capacity.deadlines`: each group placed on a flex-start fleet, with that fleet and
    its `max_run_duration` (seconds): the bound on the group's slice, said before it is asked for."""
    return {group: {"fleet": fleet.name, "max_run_duration": seconds}
            for group, fleet in zip(groups, fleets, strict=True)
            if (seconds := flex_start_duration(fleet)) is not None}


def whole_set_warnings(project_id: int, groups: list[dict], fleets: dict[str, str]) -> list[dict]:
    """The plan's warning for each `on_slice_failure: replace-slice` group that would go to a fleet
    with `queued_resource`: Google fills and deletes a queued multislice request whole, so a lost
    slice takes the set there as `whole-set` does (engine/slice_replace.py, docs/tpu.md)."""
    asked = {i: g for i, g in enumerate(groups) if g.get("on_slice_failure") == "replace-slice"
             and int(g.get("slices") or 1) > 1 and g.get("name") in fleets}
    if not asked:
        return []
    queued = {f.name for f in Fleet.objects.filter(project_id=project_id, name__in={fleets[g["name"]] for g in
                                                                                    asked.values()})
              if (f.configuration or {}).get("queued_resource")}
    return [{"field": ["groups", i, "on_slice_failure"] if len(groups) > 1 else ["on_slice_failure"],
             "message": f"on_slice_failure: replace-slice applies to fleets that create slices directly: fleet "
                        f"{fleets[g['name']]} asks Google for one queued resource per set, which Google fills and "
                        "deletes whole, so a lost slice ends the whole set there (as whole-set)"}
            for i, g in asked.items() if fleets[g["name"]] in queued]
