"""What the CLI says about flex-start slices before a run gets one: the plan's line per group on a
flex-start fleet, and the fleet's own line when it is applied (`muster ps` shows the deadline
itself once Google gives the slice: cli/render.py `deadline_text`)."""

from __future__ import annotations

from typing import Any

RECLAIMED = "the slice is reclaimed at most {} after it is made"


def written(seconds: int) -> str:
    """`2d`, `1d12h`, `90m` as `1h30m`, `8s`: the duration as a fleet file writes it."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def plan_deadlines(capacity: dict[str, Any]) -> str:
    """One line per group the plan puts on a flex-start fleet; "" when there is none."""
    return "\n".join(
        f"Deadline: group {group} (fleet {d.get('fleet')}, flex-start): "
        f"{RECLAIMED.format(written(int(d.get('max_run_duration') or 0)))} (queued_resource.max_run_duration); "
        "a job still running then ends as an interruption (its `retry` applies)"
        for group, d in (capacity.get("deadlines") or {}).items())


def fleet_deadline(fleet: dict[str, Any]) -> str:
    """The line a flex-start fleet's apply ends with; "" for any other fleet."""
    queued = (fleet.get("configuration") or {}).get("queued_resource")
    if not isinstance(queued, dict) or queued.get("provisioning_model") != "flex-start":
        return ""
    seconds = int(queued.get("max_run_duration") or 0)
    return f"flex-start: {RECLAIMED.format(written(seconds))} (queued_resource.max_run_duration)"
