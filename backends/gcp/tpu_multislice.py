"""A multislice set made of separately created slices: N nodes created as one gang, all or none.

Without a queued resource Google has no call that makes N slices together, so each slice is its
own `create_node` with its own zone fallback and lost-answer rules (`tpu_create`), and this module
holds them together: the set is ready when every slice is READY, and when one slice fails for
good (no capacity in any zone, a refusal, taken back while being made) every other slice is
deleted before the failure is reported, so no slice is left billed for a set that cannot run.
Slice i is node `<pod>-s-<i>`, the same names a queued resource's `multislice_params` gives.

One slice of a live set may also be made again on its own (`on_slice_failure: replace-slice`,
`replace_member`): the lost node is kept in `retired` until its delete is accepted, the new one
has an id of its own (`replacement_node_id`) and is asked for only in the kept slices' zone (DCN
joins slices of one zone), and while no capacity is there it is asked again on each look until
`replace_until`; the same create rules (lost answers, adoption) apply to it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from google.cloud import tpu_v2

from backends.base import BackendError, NoCapacityError, SliceInterruptedError
from backends.gcp.tpu_client import TpuConfig, member_node_id, node_name, replacement_node_id, slice_node_id
from backends.gcp.tpu_create import CreatedSlice, advance_slice, create_slice
from backends.gcp.tpu_errors import TpuApiError
from backends.gcp.tpu_nodes import LOST_STATES, PENDING_STATES, SliceStatus, delete_slice, find_slice


def advance_set(client: tpu_v2.TpuClient, cfg: TpuConfig, pod: str, slice_name: str, slices: int,
                labels: dict[str, str], state: dict[str, Any] | None = None) -> CreatedSlice:
    """Create the slices not created yet and look at the others; `statuses` has one entry per
    slice (None while it is on its way). Raises (after deleting the set) when a slice fails."""
    state = dict(state or {})
    members: list[dict[str, Any] | None] = list(state.get("members") or [])
    members += [None] * (slices - len(members))
    retired = _delete_retired(client, cfg, list(state.get("retired") or []))
    statuses: list[SliceStatus | None] = []
    waiting = False  # a replacement waits for capacity in its zone
    for i in range(slices):
        node_id = member_node_id(pod, i, members[i])
        pin = (members[i] or {}).get("pin")
        member_cfg = dataclasses.replace(cfg, zones=[pin]) if pin else cfg
        try:
            if members[i] is None:
                created = create_slice(client, member_cfg, node_id, slice_name, labels)
            else:
                created = advance_slice(client, member_cfg, node_id, slice_name, labels, _create_part(members[i]))
        except NoCapacityError as exc:
            if pin and time.time() < float(state.get("replace_until") or 0):
                members[i] = _fresh_replacement(members[i], str(exc))  # asked again on the next look
                statuses.append(None)
                waiting = True
                continue
            raise _gang_failed(client, cfg, pod, slices, members, i, exc, retired) from exc
        except BackendError as exc:
            if exc.transient:
                statuses.append(None)  # the API did not answer about this slice: look again next time
                continue
            raise _gang_failed(client, cfg, pod, slices, members, i, exc, retired) from exc
        members[i] = {**created.state, **_identity(members[i])}
        status = created.status
        if status is not None and status.state in LOST_STATES:
            raise _gang_failed(client, cfg, pod, slices, members, i, SliceInterruptedError(
                f"TPU slice {created.node_name} is {status.state} (taken back by Google)"), retired)
        if status is not None and status.state not in PENDING_STATES and status.state != "READY":
            raise _gang_failed(client, cfg, pod, slices, members, i,
                               BackendError(f"TPU slice {created.node_name} is {status.state}"), retired)
        statuses.append(status)
    first = members[0] or {}
    zone = first.get("zone", "")
    out = {**state, "multislice": True, "members": members, "retired": retired}
    if all(s is not None and s.state == "READY" for s in statuses):
        out.pop("replace_until", None)  # the set is whole again
        out.pop("replaced_at", None)
        out["members"] = [{k: v for k, v in (m or {}).items() if k not in ("replacing", "waiting")} for m in members]
    out["waiting"] = waiting
    return CreatedSlice(zone, node_name(cfg, zone, member_node_id(pod, 0, members[0])) if zone else "", None,
                        out, statuses=statuses)


def _identity(member: dict[str, Any] | None) -> dict[str, Any]:
    """What a member keeps across looks besides its create state: its own node id and zone pin."""
    return {k: v for k, v in (member or {}).items() if k in ("node_id", "pin", "replacing", "attempt")}


def _create_part(member: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in member.items() if k not in ("node_id", "pin", "replacing", "attempt", "waiting")}


def _fresh_replacement(member: dict[str, Any], said: str) -> dict[str, Any]:
    return {**_identity(member), "waiting": said[:300]}


def replace_member(pod: str, slices: int, state: dict[str, Any], index: int, until: float) -> dict[str, Any]:
    """The create state with slice `index` to be made again: its node retired (deleted on the next
    look), a new node id, pinned to the zone of the kept slices. Raises BackendError when the kept
    slices are not in one zone (a slice of another zone could not join them over DCN)."""
    members: list[dict[str, Any] | None] = list(state.get("members") or [])
    members += [None] * (slices - len(members))
    lost = members[index] or {}
    zones = sorted({(m or {}).get("zone", "") for i, m in enumerate(members) if i != index})
    if len(zones) != 1 or not zones[0]:
        raise BackendError(f"the kept slices are in zones {', '.join(z or '(unknown)' for z in zones)}: a new "
                           "slice joins them over DCN only in their one zone")
    attempt = int(lost.get("attempt", 0)) + 1
    retired = list(state.get("retired") or [])
    if lost.get("zone"):
        retired.append(f"{lost['zone']}/{member_node_id(pod, index, lost)}")  # zone/node id
    members[index] = {"node_id": replacement_node_id(pod, index, attempt), "pin": zones[0], "replacing": True,
                      "attempt": attempt}
    return {**state, "members": members, "retired": retired, "replaced_at": time.time(), "replace_until": until}


def _delete_retired(client: tpu_v2.TpuClient, cfg: TpuConfig, retired: list[str]) -> list[str]:
    """Delete the nodes of replaced slices (they hold quota); those the API did not answer stay."""
    left = []
    for name in retired:
        try:
            delete_slice(client, cfg, node_name(cfg, *name.split("/", 1)))
        except TpuApiError:
            left.append(name)
    return left


def _gang_failed(client: tpu_v2.TpuClient, cfg: TpuConfig, pod: str, slices: int,
                 members: list[dict[str, Any] | None], failed: int, exc: BackendError,
                 retired: list[str] | None = None) -> BackendError:
    """Delete every slice of the set, then the error to raise: the same kind, naming the slice."""
    deleted = delete_set(client, cfg, pod, slices, members, retired)
    others = [member_node_id(pod, i, members[i]) for i in deleted if i != failed]
    note = f"; deleted the set's other slices: {', '.join(others)}" if others else ""
    error = type(exc)(f"slice {failed} of {slices} ({member_node_id(pod, failed, members[failed])}): {exc} "
                      f"(a multislice set is created all or none){note}")
    error.reason = exc.reason
    return error


def delete_set(client: tpu_v2.TpuClient, cfg: TpuConfig, pod: str, slices: int,
               members: list[dict[str, Any] | None] | None = None, retired: list[str] | None = None) -> list[int]:
    """Delete each slice of the set wherever it is, and the nodes of replaced slices; the indexes
    of those found. A slice whose zone is not known is looked up in every zone of its own (a create
    whose answer was lost may have made it)."""
    _delete_retired(client, cfg, list(retired or []))
    found = []
    for i in range(slices):
        member = members[i] if members and i < len(members) else None
        node_id = member_node_id(pod, i, member)
        zone = (member or {}).get("zone", "")
        pin = (member or {}).get("pin")
        where = find_slice(client, dataclasses.replace(cfg, zones=[pin]) if pin else cfg, node_id) if not zone \
            else (zone, None)
        if where is None:
            continue
        delete_slice(client, cfg, node_name(cfg, where[0], node_id))
        found.append(i)
    return found


def set_node_names(cfg: TpuConfig, pod: str, zones: list[str]) -> list[str]:
    return [node_name(cfg, zone, slice_node_id(pod, i)) for i, zone in enumerate(zones)]
