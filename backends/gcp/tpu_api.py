"""A thin layer over `google.cloud.tpu_v2.TpuClient`: the only module that speaks the TPU API.

One TPU node is one pod slice; its `network_endpoints` list one address per host in worker
order. Every call is bounded by `TpuConfig.timeout` because the generated client has no default
timeout, and nothing here waits on a long-running operation: create and delete are submitted and
the caller looks again from a later task (`advance_slice`, `get_slice`).

A create ends in one of four ways, whether the API says so at once (an HTTP error) or later (the
create's Operation finishing with a google.rpc.Status error, which the client's own
`operation.result()` would raise as the same exception class):
- no capacity or quota (429 / code 8): the next zone is tried;
- a request that cannot succeed anywhere (400/3, 401/16, 403/7, 404/5): it fails at once;
- ALREADY_EXISTS (409/6) for our own node id: the node is adopted;
- anything else (timeout, connection lost, 5xx): unknown. The API may have accepted the create,
  so nothing is given up and no other zone is tried; later looks find the node by its id.

Error mapping worth knowing: over REST a 429 surfaces as `TooManyRequests` (gRPC gives its
subclass `ResourceExhausted`) and a 409 as `Conflict` (gRPC: `AlreadyExists`), so the parents are
caught to behave the same on both transports.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.cloud import tpu_v2

from backends.base import BackendError, InstanceOffer, NoCapacityError
from backends.tpu_shapes import FAMILIES, SliceShape, all_slices, parse_slice

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

# States a node passes through on its way to READY.
PENDING_STATES = frozenset(
    {"STATE_UNSPECIFIED", "CREATING", "STARTING", "RESTARTING", "REIMAGING", "REPAIRING", "UNKNOWN"}
)

# What a refused create means (see the module docstring).
NEXT_ZONE, FATAL, EXISTS, UNSURE = "next_zone", "fatal", "exists", "unsure"


class TpuApiError(BackendError):
    """The TPU API refused a call or could not be reached (timeouts included); worth retrying later."""

    transient = True  # callers polling a slice look again instead of giving the slice up


class TpuRefusedError(BackendError):
    """The TPU API refused a create in a way no other zone or later try can fix; says what to fix."""


def _default_runtime_versions() -> dict[str, str]:
    return {name: fam.default_runtime_version for name, fam in FAMILIES.items()}


@dataclass
class TpuConfig:
    project_id: str
    zones: list[str]
    # A service-account key (dict, or its JSON text). None: anonymous against a custom endpoint
    # (the loopback fake), Application Default Credentials against Google.
    credentials: dict[str, Any] | str | None = None
    api_endpoint: str | None = None
    transport: str = "rest"
    network: str = "default"
    runtime_versions: dict[str, str] = field(default_factory=_default_runtime_versions)
    spot: bool = False
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if not self.project_id:
            raise BackendError("gcp backend: project_id is required")
        if not self.zones:
            raise BackendError("gcp backend: at least one zone is required")
        if self.transport not in ("rest", "grpc"):
            raise BackendError(f"gcp backend: transport must be 'rest' or 'grpc', not {self.transport!r}")
        # A partial override keeps the defaults for the other families.
        self.runtime_versions = {**_default_runtime_versions(), **(self.runtime_versions or {})}

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TpuConfig:
        zones = config.get("zones") or []
        runtime_versions = dict(config.get("runtime_versions") or {})
        if config.get("runtime_version"):
            # A fleet names one image; a fleet is used for one family, so it applies to all of them.
            runtime_versions = {name: config["runtime_version"] for name in FAMILIES}
        return cls(
            project_id=config.get("project_id", ""),
            zones=[zones] if isinstance(zones, str) else list(zones),
            credentials=config.get("credentials"),
            api_endpoint=config.get("api_endpoint") or None,
            transport=config.get("transport") or "rest",
            network=config.get("network") or "default",
            runtime_versions=runtime_versions,
            spot=bool(config.get("spot", False)),
            timeout=float(config.get("timeout") or 30.0),
        )


@dataclass(frozen=True)
class HostEndpoint:
    worker_index: int
    internal_ip: str
    external_ip: str | None


@dataclass(frozen=True)
class SliceStatus:
    state: str  # tpu_v2.Node.State name: CREATING, READY, PREEMPTED, ...
    hosts: list[HostEndpoint]  # worker order; empty until READY
    accelerator_type: str
    health: str = ""  # tpu_v2.Node.Health name, "" when the API reports none
    name: str = ""


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


def node_name(cfg: TpuConfig, zone: str, node_id: str) -> str:
    return f"projects/{cfg.project_id}/locations/{zone}/nodes/{node_id}"


def zone_of(name: str) -> str:
    m = re.match(r"^projects/[^/]+/locations/([^/]+)/nodes/[^/]+$", name)
    if not m:
        raise BackendError(f"not a TPU node name: {name!r}")
    return m.group(1)


# -- client ---------------------------------------------------------------------------------


def make_client(cfg: TpuConfig) -> tpu_v2.TpuClient:
    credentials = _credentials(cfg)
    if cfg.transport == "grpc" and cfg.api_endpoint and cfg.api_endpoint.startswith("http://"):
        # A plain-text endpoint (a local fake) needs an insecure channel; client_options cannot say so.
        import grpc
        from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport

        channel = grpc.insecure_channel(cfg.api_endpoint.removeprefix("http://"))
        return tpu_v2.TpuClient(transport=TpuGrpcTransport(channel=channel))
    options = ClientOptions(api_endpoint=cfg.api_endpoint) if cfg.api_endpoint else None
    return tpu_v2.TpuClient(credentials=credentials, transport=cfg.transport, client_options=options)


def _credentials(cfg: TpuConfig) -> Any:
    info = cfg.credentials
    if isinstance(info, str) and info.strip():
        try:
            info = json.loads(info)
        except ValueError as exc:
            raise BackendError(f"gcp backend: credentials are not valid JSON: {exc}") from exc
    if info:
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info(info, scopes=[CLOUD_PLATFORM_SCOPE])
    if cfg.api_endpoint:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth
    import google.auth.exceptions

    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise BackendError(f"gcp backend: no credentials configured and none found: {exc}") from exc
    return credentials


@contextmanager
def _api_errors(what: str) -> Iterator[None]:
    """Turn what the client raises into BackendError, so callers handle one family of errors."""
    try:
        yield
    except BackendError:
        raise
    except gexc.GoogleAPICallError as exc:
        raise TpuApiError(f"{what}: {exc.code} {exc.message}") from exc
    except (gexc.RetryError, requests.exceptions.RequestException) as exc:
        # A REST timeout arrives as requests' ReadTimeout, untranslated by api_core.
        raise TpuApiError(f"{what}: {type(exc).__name__}: {exc}") from exc


# -- slices ---------------------------------------------------------------------------------


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
        # Cannot tell whether it exists, so creating now could make a second one: look later.
        return CreatedSlice("", "", None, {**state, "zone": "", "last": str(exc)[:300]})
    if found is not None:
        zone, status = found
        return CreatedSlice(zone, node_name(cfg, zone, node_id), status, {**state, "zone": zone})
    return _submit(client, cfg, node_id, shape, _node_spec(cfg, shape, labels, metadata), state)


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
            return _refused(client, cfg, node_id, shape, _node_spec(cfg, shape, labels, metadata), state,
                            zone, _operation_error(op))
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
    return _submit(client, cfg, node_id, shape, _node_spec(cfg, shape, labels, metadata), state)


def lost_grace(cfg: TpuConfig) -> float:
    """How long a node whose create answer was lost may stay invisible before creating again."""
    return 2 * cfg.timeout


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
    refused_zones = {z for z, _ in state["refused"]}
    for zone in [z for z in cfg.zones if z not in refused_zones]:
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
            outcome = _refused(client, cfg, node_id, shape, node, state, zone, _operation_error(op),
                               submit_next=False)
            if outcome is not None:
                return outcome
            continue
        state["operation"] = op.name
        return CreatedSlice(zone, name, _status_from_operation(op), state)
    said = "; ".join(f"{z}: {what}" for z, what in state["refused"]) or "no zone left to try"
    raise NoCapacityError(f"no capacity for {shape.name} in zones {', '.join(cfg.zones)} ({said})")


def _refused(
    client: tpu_v2.TpuClient, cfg: TpuConfig, node_id: str, shape: SliceShape, node: tpu_v2.Node,
    state: dict[str, Any], zone: str, exc: Exception, submit_next: bool = True,
) -> CreatedSlice | None:
    """What a create refused with `exc` in `zone` leads to; None means "try the next zone" when
    the caller loops over zones itself (`submit_next=False`)."""
    name = node_name(cfg, zone, node_id)
    verdict = _verdict(exc)
    said = _said(exc)
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
        raise TpuRefusedError(f"creating TPU node {name} failed: {said}. {_fix_for(exc, cfg, zone)}{before}")
    state.update(zone=zone, operation="", lost_at=time.time(), last=said[:300])
    return CreatedSlice(zone, name, None, state)


def _verdict(exc: Exception) -> str:
    if isinstance(exc, gexc.TooManyRequests):  # gRPC's ResourceExhausted is a subclass
        return NEXT_ZONE
    if isinstance(exc, gexc.Conflict) and not isinstance(exc, gexc.Aborted):  # AlreadyExists is one
        return EXISTS
    if isinstance(exc, (gexc.BadRequest, gexc.Unauthorized, gexc.Forbidden, gexc.NotFound)):
        return FATAL
    return UNSURE


def _said(exc: Exception) -> str:
    """The status name and message as Google wrote them, without the request line REST adds."""
    if not isinstance(exc, gexc.GoogleAPICallError):
        return f"{type(exc).__name__}: {exc}"
    code = exc.grpc_status_code.name if exc.grpc_status_code is not None else str(exc.code)
    message = exc.message
    response = exc.response
    if isinstance(response, requests.Response):
        try:
            error = response.json().get("error") or {}
        except ValueError:
            error = {}
        if isinstance(error, dict):
            code = str(error.get("status") or code)
            message = str(error.get("message") or message)
    return f"{code} {message}"


def _fix_for(exc: Exception, cfg: TpuConfig, zone: str) -> str:
    if isinstance(exc, gexc.Unauthorized):
        return "Fix: the credentials were rejected; check MUSTER_GCP_CREDENTIALS (or GCP.credentials)."
    if isinstance(exc, gexc.Forbidden):
        return (f"Fix: give the server's service account roles/tpu.admin in project {cfg.project_id} "
                "and enable the Cloud TPU API there.")
    if isinstance(exc, gexc.NotFound):
        return f"Fix: check that project {cfg.project_id!r} exists and that zone {zone!r} offers Cloud TPU."
    return ("Fix: check the slice type, spot, runtime_version and network against what zone "
            f"{zone!r} offers (the fleet's zones, spot and runtime_version; GCP.network).")


def _operation_error(op: Any) -> gexc.GoogleAPICallError:
    # What google.api_core.operation.Operation.result() would raise for this finished operation.
    return gexc.from_grpc_status(op.error.code, op.error.message, errors=(op.error,), response=op)


def _get_operation(client: tpu_v2.TpuClient, cfg: TpuConfig, name: str) -> Any:
    with _api_errors(f"get TPU operation {name}"):
        try:
            return client.get_operation({"name": name}, timeout=cfg.timeout)
        except gexc.NotFound:
            return None


def find_slice(client: tpu_v2.TpuClient, cfg: TpuConfig, node_id: str) -> tuple[str, SliceStatus] | None:
    """The zone and status of node `node_id` in the configured zones; None when it exists nowhere."""
    unsure = []
    for zone in cfg.zones:
        try:
            status = get_slice(client, cfg, node_name(cfg, zone, node_id))
        except TpuApiError as exc:
            if not isinstance(exc.__cause__, gexc.ServiceUnavailable):
                raise
            unsure.append(zone)
            continue
        if status is not None:
            return zone, status
    if unsure:
        # "Not found" would be a guess; a caller acting on it could duplicate or orphan a slice.
        raise TpuApiError(f"cannot tell whether TPU node {node_id} exists: zones {unsure} unavailable")
    return None


def get_slice(client: tpu_v2.TpuClient, cfg: TpuConfig, node_name: str) -> SliceStatus | None:
    """The node's state and, once READY, its hosts in worker order; None when it does not exist."""
    with _api_errors(f"get TPU node {node_name}"):
        try:
            node = client.get_node(name=node_name, timeout=cfg.timeout)
        except gexc.NotFound:
            return None
    return _status(node)


def delete_slice(client: tpu_v2.TpuClient, cfg: TpuConfig, node_name: str) -> None:
    """Submit the deletion (one call, no waiting); a node that is already gone is success."""
    with _api_errors(f"delete TPU node {node_name}"):
        try:
            client.delete_node(name=node_name, timeout=cfg.timeout)
        except gexc.NotFound:
            return


def list_slices(client: tpu_v2.TpuClient, cfg: TpuConfig, zone: str) -> list[SliceStatus]:
    with _api_errors(f"list TPU nodes in {zone}"):
        return [
            _status(node)
            for node in client.list_nodes(
                parent=f"projects/{cfg.project_id}/locations/{zone}", timeout=cfg.timeout
            )
        ]


def _node_spec(
    cfg: TpuConfig, shape: SliceShape, labels: dict[str, str], metadata: dict[str, str] | None
) -> tpu_v2.Node:
    network = (
        cfg.network if "/" in cfg.network else f"projects/{cfg.project_id}/global/networks/{cfg.network}"
    )
    return tpu_v2.Node(
        accelerator_type=shape.name,
        runtime_version=cfg.runtime_versions[shape.family.name],
        # External addresses: the server reaches each host over SSH from outside the VPC.
        network_config=tpu_v2.NetworkConfig(network=network, enable_external_ips=True),
        scheduling_config=tpu_v2.SchedulingConfig(spot=cfg.spot),
        labels=dict(labels),
        metadata=dict(metadata or {}),
    )


def _status_from_operation(op: Any) -> SliceStatus | None:
    # The raw message, not Operation.done(): done() would poll the API again.
    if not op.done or not op.HasField("response"):
        return None
    pb = tpu_v2.Node.pb(tpu_v2.Node())
    if not op.response.Unpack(pb):
        return None
    return _status(tpu_v2.Node.wrap(pb))


def _status(node: tpu_v2.Node) -> SliceStatus:
    state = tpu_v2.Node.State(node.state).name
    hosts = []
    if state == "READY":
        hosts = [
            HostEndpoint(k, ep.ip_address, ep.access_config.external_ip or None)
            for k, ep in enumerate(node.network_endpoints)
        ]
    health = tpu_v2.Node.Health(node.health).name
    return SliceStatus(
        state=state,
        hosts=hosts,
        accelerator_type=node.accelerator_type,
        health="" if health == "HEALTH_UNSPECIFIED" else health,
        name=node.name,
    )


# -- offers ---------------------------------------------------------------------------------

# Rough TPU VM host shapes (vCPUs, memory GB) from Google's public docs; v5e and v6e hosts differ
# with the number of chips they carry.
_HOST_SHAPES: dict[str, dict[int, tuple[int, int]]] = {
    "v2": {4: (96, 334)},
    "v3": {4: (96, 340)},
    "v4": {4: (240, 407)},
    "v5p": {4: (208, 448)},
    "v5litepod": {1: (24, 48), 4: (112, 192), 8: (224, 384)},
    "v6e": {1: (44, 176), 4: (180, 720), 8: (180, 1440)},
}
# Rough, indicative on-demand USD per chip-hour (us-central list prices, 2024); only used to rank
# offers, never to bill. Spot is roughly a third of it.
_CHIP_HOUR_USD = {"v2": 1.125, "v3": 2.0, "v4": 3.22, "v5p": 4.2, "v5litepod": 1.2, "v6e": 2.7}
_SPOT_FACTOR = 0.35


def host_resources(shape: SliceShape) -> dict[str, Any]:
    """What one host of this slice offers (every host of a slice is identical)."""
    cpus, memory_gb = _HOST_SHAPES[shape.family.name][shape.chips_per_host]
    return {
        "cpus": cpus,
        "memory_gb": memory_gb,
        "disk_gb": 100,
        "cpu_arch": "x86",
        "gpus": [],
        "tpu": shape.name,
        "tpu_chips": shape.chips_per_host,
        "hbm_gb": shape.hbm_gb_per_host,
    }


def slice_offers(cfg: TpuConfig) -> list[InstanceOffer]:
    """One offer per slice of the shape table; `price` is for the whole slice per hour."""
    factor = _SPOT_FACTOR if cfg.spot else 1.0
    return [
        InstanceOffer(
            backend="gcp",
            region=_region(cfg.zones[0]),
            instance_type=shape.name,
            resources=host_resources(shape),
            price=round(shape.chips * _CHIP_HOUR_USD[shape.family.name] * factor, 4),
            hosts=shape.hosts,
            zones=list(cfg.zones),
        )
        for shape in all_slices()
    ]


def _region(zone: str) -> str:
    # "us-central2-b" -> "us-central2"
    return zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone
