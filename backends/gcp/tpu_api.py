"""A thin layer over `google.cloud.tpu_v2.TpuClient`: the only module that speaks the TPU API.

One TPU node is one pod slice; its `network_endpoints` list one address per host in worker
order. Every call is bounded by `TpuConfig.timeout` because the generated client has no default
timeout, and nothing here waits on a long-running operation: create and delete are submitted and
the caller polls `get_slice` from a later task.

Error mapping worth knowing: over REST a 429 surfaces as `TooManyRequests` (gRPC gives its
subclass `ResourceExhausted`) and a 409 as `Conflict` (gRPC: `AlreadyExists`), so the parents are
caught to behave the same on both transports.
"""

from __future__ import annotations

import json
import re
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
_RESOURCE_EXHAUSTED = 8  # google.rpc.Code, as found in a finished operation's error


class TpuApiError(BackendError):
    """The TPU API refused a call or could not be reached (timeouts included); worth retrying later."""

    transient = True  # callers polling a slice look again instead of giving the slice up


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
    # once), so the caller can skip a poll; None means "submitted, poll get_slice".
    status: SliceStatus | None = None


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
) -> CreatedSlice:
    """Submit the creation of one node in the first zone with capacity; never waits for it."""
    shape = parse_slice(slice_name)
    if shape is None:
        raise BackendError(f"unknown TPU slice {slice_name!r}")
    # A create whose answer was lost (timeout, crash) may have landed in any zone; creating again
    # in an earlier zone that has capacity now would leave two billed slices.
    found = find_slice(client, cfg, node_id)
    if found is not None:
        zone, status = found
        return CreatedSlice(zone, node_name(cfg, zone, node_id), status)
    node = _node_spec(cfg, shape, labels, metadata)
    refusals = []
    for zone in cfg.zones:
        name = node_name(cfg, zone, node_id)
        with _api_errors(f"create TPU node {name}"):
            try:
                op = client.create_node(
                    parent=f"projects/{cfg.project_id}/locations/{zone}",
                    node_id=node_id,
                    node=node,
                    timeout=cfg.timeout,
                )
            except (gexc.TooManyRequests, gexc.ServiceUnavailable) as exc:
                refusals.append(f"{zone}: {exc.message}")
                continue
            except gexc.Conflict:
                # A concurrent attempt created it here between our look-up and our create.
                return CreatedSlice(zone, name, None)
        return CreatedSlice(zone, name, _status_from_operation(op.operation, name))
    raise NoCapacityError(f"no capacity for {shape.name} in any zone ({'; '.join(refusals)})")


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


def _status_from_operation(op: Any, name: str) -> SliceStatus | None:
    # The raw message, not Operation.done(): done() would poll the API again.
    if not op.done:
        return None
    if op.HasField("error"):
        msg = f"creating TPU node {name} failed: {op.error.code} {op.error.message}"
        raise NoCapacityError(msg) if op.error.code == _RESOURCE_EXHAUSTED else TpuApiError(msg)
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
