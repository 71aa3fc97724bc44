"""A multislice set made of separately created slices: N nodes created as one gang, all or none.

Without a queued resource Google has no call that makes N slices together, so each slice is its
own `create_node` with its own zone fallback and lost-answer rules (`tpu_create`), and this module
holds them together: the set is ready when every slice is READY, and when one slice fails for
good (no capacity in any zone, a refusal, taken back while being made) every other slice is
deleted before the failure is reported, so no slice is left billed for a set that cannot run.
Slice i is node `<pod>-s-<i>`, the same names a queued resource's `multislice_params` gives.
"""

from __future__ import annotations

from typing import Any

from google.cloud import tpu_v2

from backends.base import BackendError, SliceInterruptedError
from backends.gcp.tpu_client import TpuConfig, node_name, slice_node_id
from backends.gcp.tpu_create import CreatedSlice, advance_slice, create_slice
from backends.gcp.tpu_nodes import LOST_STATES, PENDING_STATES, SliceStatus, delete_slice, find_slice


def advance_set(client: tpu_v2.TpuClient, cfg: TpuConfig, pod: str, slice_name: str, slices: int,
                labels: dict[str, str], state: dict[str, Any] | None = None) -> CreatedSlice:
    """Create the slices not created yet and look at the others; `statuses` has one entry per
    slice (None while it is on its way). Raises (after deleting the set) when a slice fails."""
    members: list[dict[str, Any] | None] = list((state or {}).get("members") or [])
    members += [None] * (slices - len(members))
    statuses: list[SliceStatus | None] = []
    for i in range(slices):
        node_id = slice_node_id(pod, i)
        try:
            if members[i] is None:
                created = create_slice(client, cfg, node_id, slice_name, labels)
            else:
                created = advance_slice(client, cfg, node_id, slice_name, labels, members[i])
        except BackendError as exc:
            if exc.transient:
                statuses.append(None)  # the API did not answer about this slice: look again next time
                continue
            raise _gang_failed(client, cfg, pod, slices, members, i, exc) from exc
        members[i] = created.state
        status = created.status
        if status is not None and status.state in LOST_STATES:
            raise _gang_failed(client, cfg, pod, slices, members, i, SliceInterruptedError(
                f"TPU slice {created.node_name} is {status.state} (taken back by Google)"))
        if status is not None and status.state not in PENDING_STATES and status.state != "READY":
            raise _gang_failed(client, cfg, pod, slices, members, i,
                               BackendError(f"TPU slice {created.node_name} is {status.state}"))
        statuses.append(status)
    first = members[0] or {}
    zone = first.get("zone", "")
    return CreatedSlice(zone, node_name(cfg, zone, slice_node_id(pod, 0)) if zone else "", None,
                        {"multislice": True, "members": members}, statuses=statuses)


def _gang_failed(client: tpu_v2.TpuClient, cfg: TpuConfig, pod: str, slices: int,
                 members: list[dict[str, Any] | None], failed: int, exc: BackendError) -> BackendError:
    """Delete every slice of the set, then the error to raise: the same kind, naming the slice."""
    deleted = delete_set(client, cfg, pod, slices, members)
    others = [slice_node_id(pod, i) for i in deleted if i != failed]
    note = f"; deleted the set's other slices: {', '.join(others)}" if others else ""
    error = type(exc)(f"slice {failed} of {slices} ({slice_node_id(pod, failed)}): {exc} (a multislice set is "
                      f"created all or none){note}")
    error.reason = exc.reason
    return error


def delete_set(client: tpu_v2.TpuClient, cfg: TpuConfig, pod: str, slices: int,
               members: list[dict[str, Any] | None] | None = None) -> list[int]:
    """Delete each slice of the set wherever it is; the indexes of those found. A slice whose zone
    is not known is looked up in every zone (a create whose answer was lost may have made it)."""
    found = []
    for i in range(slices):
        node_id = slice_node_id(pod, i)
        member = members[i] if members and i < len(members) else None
        zone = (member or {}).get("zone", "")
        where = find_slice(client, cfg, node_id) if not zone else (zone, None)
        if where is None:
            continue
        delete_slice(client, cfg, node_name(cfg, where[0], node_id))
        found.append(i)
    return found


def set_node_names(cfg: TpuConfig, pod: str, zones: list[str]) -> list[str]:
    return [node_name(cfg, zone, slice_node_id(pod, i)) for i, zone in enumerate(zones)]
