"""The fake's nodes: create, get, list, delete, and the CREATING -> READY step with endpoints."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from http import HTTPStatus

from google.cloud import tpu_v2

from backends.gcp.tpu_nodes import shape_name
from backends.gcp.tpu_shapes import parse_slice
from tests.fake_tpu.errors import FakeApiError

HostAddresses = list[str] | Callable[[str, int], list[str]]


class NodeRecord:
    def __init__(self, node: tpu_v2.Node, polls_left: int, create_op: str,
                 fails_with: tuple[int, str] | None = None):
        self.node = node
        self.polls_left = polls_left
        self.create_op = create_op
        self.fails_with = fails_with  # (google.rpc code, message) the create operation ends with
        self.created_at = time.time()
        self.ready_at: float | None = None  # epoch seconds it went READY


class NodesMixin:
    """Node calls of FakeTpuServer (its attributes are set in FakeTpuServer.__init__)."""

    def preempt(self, node_name: str) -> None:
        """What Google does to a spot slice: the node PREEMPTED, its queued resource SUSPENDED."""
        with self.lock:
            rec = self.nodes[node_name]
            rec.node.state = tpu_v2.Node.State.PREEMPTED
            if rec.node.queued_resource in self.queued:
                self._set_queued(self.queued[rec.node.queued_resource], "SUSPENDED", initiator="SERVICE")

    def vanish(self, node_name: str) -> None:
        with self.lock:
            del self.nodes[node_name]

    def set_health(self, node_name: str, health: str) -> None:
        with self.lock:
            self.nodes[node_name].node.health = tpu_v2.Node.Health[health]

    def node(self, name: str) -> tpu_v2.Node | None:
        with self.lock:
            rec = self.nodes.get(name)
            return tpu_v2.Node(rec.node) if rec else None

    def set_state(self, name: str, state: str) -> None:
        """Force a node into a state (e.g. PREEMPTED) to exercise the backend's error paths."""
        with self.lock:
            self.nodes[name].node.state = tpu_v2.Node.State[state]

    def _create(self, project: str, zone: str, node_id: str, body: bytes) -> str:
        parent = f"projects/{project}/locations/{zone}"
        name = f"{parent}/nodes/{node_id}"
        if zone in self.exhausted_zones:
            raise FakeApiError(
                HTTPStatus.TOO_MANY_REQUESTS, f"There is no more capacity in the zone {zone!r}"
            )
        if zone in self.unavailable_zones:
            raise FakeApiError(HTTPStatus.SERVICE_UNAVAILABLE, f"zone {zone!r} is unavailable")
        if zone in self.create_errors:
            raise FakeApiError(*self.create_errors[zone])
        refused = [err for end, err in self.node_create_errors.items() if node_id.endswith(end)]
        if refused:
            raise FakeApiError(*refused[0])
        if not node_id:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, "nodeId is required")
        if name in self.nodes:
            raise FakeApiError(HTTPStatus.CONFLICT, f"node {name} already exists")
        node = tpu_v2.Node.from_json(body or b"{}", ignore_unknown_fields=True)
        if node.accelerator_type and "accelerator_config" in node:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, "give acceleratorType or acceleratorConfig, not both")
        shape = parse_slice(shape_name(node))
        if shape is None:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, f"unknown accelerator type {node.accelerator_type!r} "
                               f"or config {tpu_v2.AcceleratorConfig.to_dict(node.accelerator_config)}")
        node.name = name
        node.state = tpu_v2.Node.State.CREATING
        op_name = self._new_operation(parent, "create", name)
        self.nodes[name] = NodeRecord(node, self.creation_polls, op_name, self.failed_operations.get(zone))
        self.created_at[name] = self.nodes[name].created_at
        self._maybe_ready(self.nodes[name], count_poll=False)
        return self._operation_json(op_name)

    def _get(self, name: str) -> str:
        rec = self._record(name)
        self._maybe_ready(rec, count_poll=True)
        return tpu_v2.Node.to_json(rec.node)

    def _list(self, parent: str) -> str:
        nodes = [
            json.loads(tpu_v2.Node.to_json(r.node))
            for n, r in self.nodes.items()
            if n.startswith(parent + "/")
        ]
        return json.dumps({"nodes": nodes})

    def _delete(self, name: str) -> str:
        self._record(name)
        del self.nodes[name]
        parent = name.rsplit("/nodes/", 1)[0]
        return self._operation_json(self._new_operation(parent, "delete", name))


    def _record(self, name: str) -> NodeRecord:
        rec = self.nodes.get(name)
        if rec is None:
            raise FakeApiError(HTTPStatus.NOT_FOUND, f"node {name} not found")
        return rec

    def _maybe_ready(self, rec: NodeRecord, *, count_poll: bool) -> None:
        if rec.node.state != tpu_v2.Node.State.CREATING or self.stuck_creating:
            return
        if rec.polls_left > 0:
            if count_poll:
                rec.polls_left -= 1
            return
        if time.time() < rec.created_at + self.creation_seconds:
            return  # as Google takes minutes to make a slice (the recovery bench sets this)
        if rec.fails_with is not None:
            # As Google does for a stockout: the operation ends with the error, no node is left.
            self.operations[rec.create_op]["error"] = rec.fails_with
            del self.nodes[rec.node.name]
            return
        node_id = rec.node.name.rsplit("/", 1)[1]
        hosts = parse_slice(shape_name(rec.node)).hosts
        internal = _resolve(self.host_addresses, node_id, hosts)
        external = _resolve(self.external_addresses, node_id, hosts) if self.external_addresses else None
        rec.node.network_endpoints = [
            tpu_v2.NetworkEndpoint(
                ip_address=ip,
                port=8470,
                access_config=tpu_v2.AccessConfig(external_ip=external[k]) if external else None,
            )
            for k, ip in enumerate(internal)
        ]
        rec.node.state = tpu_v2.Node.State.READY
        rec.node.health = tpu_v2.Node.Health.HEALTHY
        rec.ready_at = time.time()


def default_addresses(node_id: str, hosts: int) -> list[str]:
    return [f"10.200.0.{k + 2}" for k in range(hosts)]


def _resolve(addresses: HostAddresses, node_id: str, hosts: int) -> list[str]:
    out = addresses(node_id, hosts) if callable(addresses) else list(addresses)
    if len(out) < hosts:
        raise FakeApiError(
            HTTPStatus.INTERNAL_SERVER_ERROR, f"fake configured with {len(out)} addresses for {hosts} hosts"
        )
    return out[:hosts]
