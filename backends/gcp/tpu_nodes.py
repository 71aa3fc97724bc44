"""The TPU API's node calls: get, find, list and delete a node, and read one into a SliceStatus.

Each is one bounded call that never waits: a node's `network_endpoints` list one address per
host in worker order, read once the node is READY.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import tpu_v2

from backends.base import BackendError
from backends.gcp.tpu_client import TpuConfig, node_name
from backends.gcp.tpu_errors import TpuApiError, api_errors
from backends.gcp.tpu_shapes import FAMILIES, SliceShape, with_topology

# States a node passes through on its way to READY.
PENDING_STATES = frozenset(
    {"STATE_UNSPECIFIED", "CREATING", "STARTING", "RESTARTING", "REIMAGING", "REPAIRING", "UNKNOWN"}
)

# A node in one of these was taken back by Google (spot preemption, maintenance or end of life).
LOST_STATES = frozenset({"PREEMPTED", "TERMINATED"})


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
    queued_resource: str = ""  # the queued resource that made the node, "" for a direct create


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
    with api_errors(f"get TPU node {node_name}"):
        try:
            node = client.get_node(name=node_name, timeout=cfg.timeout)
        except gexc.NotFound:
            return None
    return _status(node)


def delete_slice(client: tpu_v2.TpuClient, cfg: TpuConfig, node_name: str) -> None:
    """Submit the deletion (one call, no waiting); a node that is already gone is success."""
    with api_errors(f"delete TPU node {node_name}"):
        try:
            client.delete_node(name=node_name, timeout=cfg.timeout)
        except gexc.NotFound:
            return


def list_slices(client: tpu_v2.TpuClient, cfg: TpuConfig, zone: str) -> list[SliceStatus]:
    with api_errors(f"list TPU nodes in {zone}"):
        return [
            _status(node)
            for node in client.list_nodes(
                parent=f"projects/{cfg.project_id}/locations/{zone}", timeout=cfg.timeout
            )
        ]


def node_spec(
    cfg: TpuConfig, shape: SliceShape, labels: dict[str, str], metadata: dict[str, str] | None
) -> tpu_v2.Node:
    network = (
        cfg.network if "/" in cfg.network else f"projects/{cfg.project_id}/global/networks/{cfg.network}"
    )
    runtime_version = cfg.runtime_versions.get(shape.family.name) or ""
    if not runtime_version:
        raise BackendError(f"{shape.family.name} has no default TPU VM image: set runtime_version on the fleet "
                           "(the version Google gave you for it)")
    if shape.topology:
        # Google's two ways of naming a slice are exclusive: a type, or a family and a topology.
        kind: dict[str, Any] = {"accelerator_config": tpu_v2.AcceleratorConfig(
            type_=tpu_v2.AcceleratorConfig.Type[shape.family.accelerator_config_type], topology=shape.topology)}
    else:
        kind = {"accelerator_type": shape.accelerator_type}
    return tpu_v2.Node(
        **kind,
        runtime_version=runtime_version,
        # External addresses: the server reaches each host over SSH from outside the VPC.
        network_config=tpu_v2.NetworkConfig(network=network, enable_external_ips=True),
        scheduling_config=tpu_v2.SchedulingConfig(spot=cfg.spot),
        labels=dict(labels),
        metadata=dict(metadata or {}),
    )


def status_from_operation(op: Any) -> SliceStatus | None:
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
        accelerator_type=shape_name(node),
        health="" if health == "HEALTH_UNSPECIFIED" else health,
        name=node.name,
        queued_resource=node.queued_resource,
    )


def shape_name(node: tpu_v2.Node) -> str:
    """The slice's canonical name: a node made from a topology says so in its acceleratorConfig."""
    config = node.accelerator_config
    if config.topology:
        family = next((f for f in FAMILIES.values() if f.accelerator_config_type
                       and f.accelerator_config_type == tpu_v2.AcceleratorConfig.Type(config.type_).name), None)
        if family is not None:
            try:
                return with_topology(family, config.topology).name
            except ValueError:
                pass
    return node.accelerator_type


def owning_request(client: tpu_v2.TpuClient, cfg: TpuConfig, node_name: str) -> str:
    """The queued resource the node belongs to ("" for none, or when the node is gone)."""
    status = get_slice(client, cfg, node_name)
    return status.queued_resource if status else ""


