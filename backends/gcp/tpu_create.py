"""Creating a slice without waiting on it: submit, follow the long-running operation, try zones.

Nothing here waits on a long-running operation: a create is submitted and the caller looks again
from a later task (`advance_slice`), carrying where the create stands as JSON (`CreatedSlice.state`).
What each refusal leads to (next zone, fail at once, adopt, look again later) is decided in
`tpu_errors`; this module keeps the state machine that acts on it, in its own file because the
lost-answer and zone-order rules are what keeps a retry from leaving two billed slices.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.cloud import tpu_v2

from backends.base import BackendError, NoCapacityError
from backends.gcp.tpu_client import TpuConfig, node_name
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
    operation_error,
)
from backends.gcp.tpu_nodes import (
    PENDING_STATES,
    SliceStatus,
    delete_slice,
    find_slice,
    get_slice,
    node_spec,
    status_from_operation,
)
from backends.gcp.tpu_shapes import SliceShape, parse_slice


@dataclass(frozen=True)
class CreatedSlice:
    zone: str
    node_name: str
    # Set when the answer already described the node (it existed, or the operation finished at
    # once), so the caller can skip a poll; None means "on its way, look again".
    status: SliceStatus | None = None
    # Where the create stands, as JSON, for the next `advance_slice`: `zone` of the current try
    # ("" = not known yet), its `operation` ("" = none to follow), `lost_at` (epoch seconds the
    # answer was lost, else None) and `refused` ([zone, what it said] for each zone that refused).
    state: dict[str, Any] = field(default_factory=dict)
    # A multislice set: one status per slice, in slice order (None while that slice is on its way).
    statuses: list[SliceStatus | None] | None = None


def create_slice(
    client: tpu_v2.TpuClient,
    cfg: TpuConfig,
    node_id: str,
    slice_name: str,
    labels: dict[str, str],
    metadata: dict[str, str] | None = None,
    state: dict[str, Any] | None = None,
) -> CreatedSlice:
    """Submit the creation of one node in the first zone with capacity; never waits for it."""
    shape = _shape(slice_name)
    state = _new_state(state)
    # A create whose answer was lost (timeout, crash) may have landed in any zone; creating again
    # in an earlier zone that has capacity now would leave two billed slices.
    try:
        found = find_slice(client, cfg, node_id)
    except TpuApiError as exc:
        return not_known_yet(state, exc)
    if found is not None:
        zone, status = found
        return CreatedSlice(zone, node_name(cfg, zone, node_id), status, {**state, "zone": zone})
    return _submit(client, cfg, node_id, shape, node_spec(cfg, shape, labels, metadata), state)


def advance_slice(
    client: tpu_v2.TpuClient,
    cfg: TpuConfig,
    node_id: str,
    slice_name: str,
    labels: dict[str, str],
    state: dict[str, Any],
    metadata: dict[str, str] | None = None,
) -> CreatedSlice:
    """One look at a create in progress: follow its operation, find a node whose create answer was
    lost, or go on to the next zone when the operation failed for capacity.

    Raises NoCapacityError when every zone refused, TpuRefusedError for a request that cannot
    succeed, TpuApiError (transient) when the API did not answer this look.
    """
    state = _new_state(state)
    zone = state["zone"]
    if not zone:
        return create_slice(client, cfg, node_id, slice_name, labels, metadata, state)
    shape = _shape(slice_name)
    name = node_name(cfg, zone, node_id)
    status = get_slice(client, cfg, name)
    if state["operation"] and (status is None or status.state in PENDING_STATES):
        # The node alone cannot say why a create failed (after a stockout it is simply gone),
        # so while it is not up yet its operation is read too.
        op = _get_operation(client, cfg, state["operation"])
        if op is None:  # the operation is gone (expired): the node itself says how it went
            state.update(operation="", lost_at=None if status else time.time())
        elif op.done and op.HasField("error"):
            if status is not None:
                delete_slice(client, cfg, name)  # a failed node left behind is not ours to keep
            state["operation"] = ""
            return _refused(client, cfg, node_id, shape, node_spec(cfg, shape, labels, metadata), state,
                            zone, operation_error(op))
        elif op.done:
            state["operation"] = ""
        elif status is None:
            return CreatedSlice(zone, name, None, state)  # accepted, not visible yet
    if status is not None:
        return CreatedSlice(zone, name, status, {**state, "lost_at": None})
    if state["lost_at"] is None:
        raise BackendError(f"TPU slice {name} no longer exists")
    if time.time() - state["lost_at"] < lost_grace(cfg):
        return CreatedSlice(zone, name, None, state)  # an accepted create may not show yet
    # Long enough: the lost create was never accepted. The same id in the same zone again cannot
    # make a second node (it would be ALREADY_EXISTS, which adopts it).
    return _submit(client, cfg, node_id, shape, node_spec(cfg, shape, labels, metadata), state)


def lost_grace(cfg: TpuConfig) -> float:
    """How long a node whose create answer was lost may stay invisible before creating again."""
    return 2 * cfg.timeout


def not_known_yet(state: dict[str, Any], exc: Exception) -> CreatedSlice:
    """The answer when the lookup of an earlier create failed: whether it exists cannot be told, so
    creating now could make a second one (billed twice): look again later."""
    return CreatedSlice("", "", None, {**state, "zone": "", "last": str(exc)[:300]})


def untried_zones(cfg: TpuConfig, state: dict[str, Any]) -> list[str]:
    """The configured zones in their order, less those that refused this create already."""
    refused = {zone for zone, _ in state["refused"]}
    return [zone for zone in cfg.zones if zone not in refused]


def no_capacity(cfg: TpuConfig, shape: SliceShape, state: dict[str, Any]) -> NoCapacityError:
    """Every zone refused: what each said."""
    said = "; ".join(f"{zone}: {what}" for zone, what in state["refused"]) or "no zone left to try"
    return NoCapacityError(f"no capacity for {shape.name} in zones {', '.join(cfg.zones)} ({said})")


def _new_state(state: dict[str, Any] | None) -> dict[str, Any]:
    base = {"zone": "", "operation": "", "lost_at": None, "refused": []}
    return {**base, **(state or {}), "refused": [list(r) for r in (state or {}).get("refused", [])]}


def _shape(slice_name: str) -> SliceShape:
    shape = parse_slice(slice_name)
    if shape is None:
        raise BackendError(f"unknown TPU slice {slice_name!r}")
    return shape


def _submit(
    client: tpu_v2.TpuClient, cfg: TpuConfig, node_id: str, shape: SliceShape, node: tpu_v2.Node,
    state: dict[str, Any],
) -> CreatedSlice:
    """Create in each zone not yet refused, in order, until one takes it or says something final."""
    for zone in untried_zones(cfg, state):
        name = node_name(cfg, zone, node_id)
        state.update(zone=zone, operation="", lost_at=None)
        try:
            op = client.create_node(
                parent=f"projects/{cfg.project_id}/locations/{zone}",
                node_id=node_id,
                node=node,
                timeout=cfg.timeout,
            ).operation
        except (gexc.GoogleAPICallError, gexc.RetryError, requests.exceptions.RequestException) as exc:
            outcome = _refused(client, cfg, node_id, shape, node, state, zone, exc, submit_next=False)
            if outcome is not None:
                return outcome
            continue
        if op.done and op.HasField("error"):
            outcome = _refused(client, cfg, node_id, shape, node, state, zone, operation_error(op),
                               submit_next=False)
            if outcome is not None:
                return outcome
            continue
        state["operation"] = op.name
        return CreatedSlice(zone, name, status_from_operation(op), state)
    raise no_capacity(cfg, shape, state)


def _refused(
    client: tpu_v2.TpuClient, cfg: TpuConfig, node_id: str, shape: SliceShape, node: tpu_v2.Node,
    state: dict[str, Any], zone: str, exc: Exception, submit_next: bool = True,
) -> CreatedSlice | None:
    """What a create refused with `exc` in `zone` leads to; None means "try the next zone" when
    the caller loops over zones itself (`submit_next=False`)."""
    name = node_name(cfg, zone, node_id)
    verdict = classify_refusal(exc)
    said = api_message(exc)
    if verdict == NEXT_ZONE:
        state["refused"].append([zone, said[:300]])
        state.update(zone="", operation="", lost_at=None)
        return _submit(client, cfg, node_id, shape, node, state) if submit_next else None
    if verdict == EXISTS:
        # Our own deterministic id: an earlier try of this very create made it.
        state.update(zone=zone, operation="", lost_at=None)
        return CreatedSlice(zone, name, None, state)
    if verdict == FATAL:
        before = "".join(f"; {z} said: {what}" for z, what in state["refused"])
        raise TpuRefusedError(f"creating TPU node {name} failed: {said}. {fix_for(exc, cfg, zone)}{before}")
    state.update(zone=zone, operation="", lost_at=time.time(), last=said[:300])
    return CreatedSlice(zone, name, None, state)


def _get_operation(client: tpu_v2.TpuClient, cfg: TpuConfig, name: str) -> Any:
    with api_errors(f"get TPU operation {name}"):
        try:
            return client.get_operation({"name": name}, timeout=cfg.timeout)
        except gexc.NotFound:
            return None


