"""Slices requested as Cloud TPU queued resources: one request, one zone at a time.

A queued resource (`projects.locations.queuedResources`) waits at Google until the whole slice can
be given (CREATING, ACCEPTED or WAITING_FOR_RESOURCES, PROVISIONING), then goes ACTIVE with its
node made; it may instead end FAILED (kept by Google until deleted) or, for spot, be SUSPENDED
when the slice is preempted. The rules that keep a slice from being billed twice:
- one zone at a time: a request in the next zone is made only after the previous one was
  deleted (two live requests could both go ACTIVE and both bill);
- the request id is the pod's name, so a create whose answer was lost is found (or answered
  409 ALREADY_EXISTS) and adopted, never made a second time;
- a request is deleted with `force` (its nodes first, then the request).
Where the request stands travels as JSON in `CreatedSlice.state`, as for direct creates.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.cloud import tpu_v2
from google.rpc import code_pb2

from backends.base import BackendError, SliceInterruptedError
from backends.gcp import tpu_flex
from backends.gcp.tpu_client import TpuConfig, node_name, queued_name, slice_node_id
from backends.gcp.tpu_create import CreatedSlice, lost_grace, no_capacity, not_known_yet, untried_zones
from backends.gcp.tpu_errors import (
    EXISTS,
    FATAL,
    NEXT_ZONE,
    TpuApiError,
    TpuRefusedError,
    api_errors,
    api_message,
    classify_refusal,
    fix_for,
)
from backends.gcp.tpu_nodes import get_slice, node_spec
from backends.gcp.tpu_shapes import SliceShape, parse_slice

# The request is still on its way to a slice (ACCEPTED is what WAITING_FOR_RESOURCES replaced).
QUEUED_STATES = frozenset({"STATE_UNSPECIFIED", "CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING"})
LOST_STATES = frozenset({"SUSPENDING", "SUSPENDED"})
# A FAILED request whose error says this is a capacity outcome: the next zone may have it.
_NEXT_ZONE_CODES = {code_pb2.RESOURCE_EXHAUSTED, code_pb2.DEADLINE_EXCEEDED}


def create_queued(client: tpu_v2.TpuClient, cfg: TpuConfig, qr_id: str, slice_name: str,
                  labels: dict[str, str], state: dict[str, Any] | None = None, slices: int = 1) -> CreatedSlice:
    """Submit the request in the first zone not refused yet, unless one of this id exists. With
    `slices` > 1 it is one request for a multislice set (`multislice_params.node_count`)."""
    shape = _shape(slice_name)
    state = _new_state(state)
    if slices > 1:
        state["slices"] = slices
    try:
        found = find_queued(client, cfg, qr_id)
    except TpuApiError as exc:
        return not_known_yet(state, exc)
    if found is not None:
        zone, qr = found
        state.update(zone=zone, lost_at=None)
        return _follow(client, cfg, qr_id, shape, labels, state, qr)
    return _submit(client, cfg, qr_id, shape, labels, state)


def advance_queued(client: tpu_v2.TpuClient, cfg: TpuConfig, qr_id: str, slice_name: str,
                   labels: dict[str, str], state: dict[str, Any]) -> CreatedSlice:
    """One look at the request: still queued, ACTIVE (the node), FAILED (next zone or a final
    refusal), SUSPENDED (the slice is lost: SliceInterruptedError)."""
    shape = _shape(slice_name)
    state = _new_state(state)
    zone = state["zone"]
    if not zone:
        return create_queued(client, cfg, qr_id, slice_name, labels, state)
    qr = get_queued(client, cfg, queued_name(cfg, zone, qr_id))
    if qr is not None:
        state["lost_at"] = None
        return _follow(client, cfg, qr_id, shape, labels, state, qr)
    if state["lost_at"] is not None:
        if time.time() - state["lost_at"] < lost_grace(cfg):
            return CreatedSlice(zone, node_name(cfg, zone, qr_id), None, state)  # may not show yet
        # Never accepted: the same id in the same zone again (409 would adopt it).
        return _submit(client, cfg, qr_id, shape, labels, state)
    if state["qr_state"] == "ACTIVE":
        raise SliceInterruptedError(f"queued resource {queued_name(cfg, zone, qr_id)} is gone")
    raise BackendError(f"queued resource {queued_name(cfg, zone, qr_id)} no longer exists")


def find_queued(client: tpu_v2.TpuClient, cfg: TpuConfig, qr_id: str) -> tuple[str, tpu_v2.QueuedResource] | None:
    for zone in cfg.zones:
        qr = get_queued(client, cfg, queued_name(cfg, zone, qr_id))
        if qr is not None:
            return zone, qr
    return None


def get_queued(client: tpu_v2.TpuClient, cfg: TpuConfig, name: str) -> tpu_v2.QueuedResource | None:
    with api_errors(f"get queued resource {name}"):
        try:
            return client.get_queued_resource(name=name, timeout=cfg.timeout)
        except gexc.NotFound:
            return None


def list_queued(client: tpu_v2.TpuClient, cfg: TpuConfig, zone: str) -> dict[str, str]:
    """{request name: state name} of every queued resource in the zone, in one call."""
    with api_errors(f"list queued resources in {zone}"):
        return {qr.name: state_of(qr) for qr in client.list_queued_resources(
            parent=f"projects/{cfg.project_id}/locations/{zone}", timeout=cfg.timeout)}


def delete_queued(client: tpu_v2.TpuClient, cfg: TpuConfig, name: str) -> None:
    """Submit the deletion with force (the nodes, then the request); one already gone is success."""
    with api_errors(f"delete queued resource {name}"):
        try:
            client.delete_queued_resource(request={"name": name, "force": True}, timeout=cfg.timeout)
        except gexc.NotFound:
            return


def state_of(qr: tpu_v2.QueuedResource) -> str:
    return tpu_v2.QueuedResourceState.State(qr.state.state).name


def request_for(cfg: TpuConfig, zone: str, qr_id: str, shape: SliceShape,
                labels: dict[str, str], slices: int = 1) -> tpu_v2.QueuedResource:
    node = node_spec(cfg, shape, labels, None)
    node.scheduling_config = None  # the tier is the request's (spot {}), not the node's
    parent = f"projects/{cfg.project_id}/locations/{zone}"
    if slices > 1:
        # Google names the nodes `<prefix>-0` .. `<prefix>-<N-1>` and sets up their DCN together.
        params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(node_count=slices,
                                                                     node_id_prefix=f"{qr_id}-s")
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, multislice_params=params, node=node)
    else:
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=qr_id, node=node)
    policy = (tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration=timedelta(seconds=cfg.valid_until))
              if cfg.valid_until else None)
    reservation = cfg.reservation
    if reservation and "/" not in reservation:
        reservation = f"{parent}/reservations/{reservation}"
    return tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
        spot=tpu_v2.QueuedResource.Spot() if cfg.spot else None,
        queueing_policy=policy,
        reservation_name=reservation,
    )


def _submit(client: tpu_v2.TpuClient, cfg: TpuConfig, qr_id: str, shape: SliceShape,
            labels: dict[str, str], state: dict[str, Any]) -> CreatedSlice:
    for zone in untried_zones(cfg, state):
        state.update(zone=zone, lost_at=None, qr_state="", since=time.time())
        parent = f"projects/{cfg.project_id}/locations/{zone}"
        request = request_for(cfg, zone, qr_id, shape, labels, state.get("slices") or 1)
        try:
            if cfg.max_run_duration:
                tpu_flex.create_flex(client, cfg, parent, qr_id, request)
            else:
                client.create_queued_resource(parent=parent, queued_resource_id=qr_id,
                                              queued_resource=request, timeout=cfg.timeout)
        except (gexc.GoogleAPICallError, gexc.RetryError, requests.exceptions.RequestException) as exc:
            verdict = classify_refusal(exc)
            if verdict == NEXT_ZONE:
                state["refused"].append([zone, api_message(exc)[:300]])
                continue
            if verdict == EXISTS:
                # Ours, adopted; a lookup that does not show it yet gets the lost-create grace again.
                state["lost_at"] = time.time()
                return CreatedSlice(zone, node_name(cfg, zone, qr_id), None, state)
            if verdict == FATAL:
                raise TpuRefusedError(f"creating queued resource {queued_name(cfg, zone, qr_id)} failed: "
                                      f"{api_message(exc)}. {fix_for(exc, cfg, zone)}{_before(state)}") from exc
            # No answer: it may have been taken. Look it up in this zone before anything else.
            state.update(lost_at=time.time(), last=api_message(exc)[:300])
            return CreatedSlice(zone, node_name(cfg, zone, qr_id), None, state)
        state["qr_state"] = "CREATING"
        return CreatedSlice(zone, node_name(cfg, zone, qr_id), None, state)
    raise no_capacity(cfg, shape, state)


def _follow(client: tpu_v2.TpuClient, cfg: TpuConfig, qr_id: str, shape: SliceShape,
            labels: dict[str, str], state: dict[str, Any], qr: tpu_v2.QueuedResource) -> CreatedSlice:
    zone = state["zone"]
    name = queued_name(cfg, zone, qr_id)
    current = state_of(qr)
    if current != state["qr_state"]:
        state.update(qr_state=current, since=time.time())
        if current == "ACTIVE" and cfg.max_run_duration:
            # Google gives a flex-start slice for max_run_duration from when it is given; the client
            # cannot read Google's own end time, so it is counted from the first look at ACTIVE.
            state.update(flex_deadline=state["since"] + cfg.max_run_duration, max_run_duration=cfg.max_run_duration)
    if current in QUEUED_STATES:
        return CreatedSlice(zone, node_name(cfg, zone, qr_id), None, state)
    if current == "ACTIVE" and (state.get("slices") or 1) > 1:
        names = [node_name(cfg, zone, slice_node_id(qr_id, i)) for i in range(state["slices"])]
        return CreatedSlice(zone, names[0], None, state, statuses=[get_slice(client, cfg, n) for n in names])
    if current == "ACTIVE":
        status = get_slice(client, cfg, node_name(cfg, zone, qr_id))
        return CreatedSlice(zone, node_name(cfg, zone, qr_id), status, state)
    if current in LOST_STATES:
        delete_queued(client, cfg, name)
        raise SliceInterruptedError(f"queued resource {name} is {current} ({flex_end(state) or 'the slice was preempted'})")
    if current == "FAILED":
        error = qr.state.failed_data.error
        said = f"{_code_name(error.code)} {error.message}".strip()
        # Google keeps a failed request until it is deleted; it goes before any other zone is tried.
        delete_queued(client, cfg, name)
        if error.code in _NEXT_ZONE_CODES or "expired" in error.message.lower():
            state["refused"].append([zone, said[:300]])
            state.update(zone="", qr_state="", lost_at=None)
            return _submit(client, cfg, qr_id, shape, labels, state)
        raise TpuRefusedError(f"queued resource {name} failed: {said}. Fix: check the slice type, spot, "
                              f"reservation and runtime_version against what zone {zone!r} offers{_before(state)}")
    return CreatedSlice(zone, node_name(cfg, zone, qr_id), None, state)  # DELETING: look again


def flex_end(state: dict[str, Any]) -> str:
    """Why a flex-start slice went: its run time is over, once the deadline has passed ("" before,
    or for a request that is not flex-start: then it was taken back for another reason)."""
    deadline = state.get("flex_deadline")
    if not deadline or time.time() < deadline - FLEX_EARLY:
        return ""
    hours = state.get("max_run_duration", 0) / 3600
    return f"flex-start max_run_duration {hours:g}h is over: Google reclaimed the slice"


# Google's end time and the first look at ACTIVE differ by up to a poll interval.
FLEX_EARLY = 120


def _code_name(code: int) -> str:
    try:
        return code_pb2.Code.Name(code)
    except ValueError:
        return str(code)


def _before(state: dict[str, Any]) -> str:
    return "".join(f"; {z} said: {what}" for z, what in state["refused"])


def _new_state(state: dict[str, Any] | None) -> dict[str, Any]:
    base = {"queued": True, "zone": "", "lost_at": None, "refused": [], "qr_state": "", "since": None}
    return {**base, **(state or {}), "refused": [list(r) for r in (state or {}).get("refused", [])]}


def _shape(slice_name: str) -> SliceShape:
    shape = parse_slice(slice_name)
    if shape is None:
        raise BackendError(f"unknown TPU slice {slice_name!r}")
    return shape
