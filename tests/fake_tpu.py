"""A loopback fake of the Cloud TPU v2 REST API, driven by the real `tpu_v2.TpuClient`.

There is no official TPU emulator, so the gcp backend is tested by pointing the real client
(REST transport, `api_endpoint="http://127.0.0.1:PORT"`, anonymous credentials) at this server.
Bodies are produced and parsed with the library's own message types, so a field-name or
enum-encoding mismatch shows up here rather than in production.

Behaviour worth knowing when writing tests:
- create answers with a long-running Operation (google.longrunning.Operation: name, metadata,
  done, and once done either `response` (the Node) or `error` (a google.rpc.Status with code,
  message, details)); the node stays CREATING for `creation_polls` GETs (of the node or of its
  operation) and then turns READY with one network endpoint per host, the host count coming from
  the slice-shape table;
- a create is refused in one of the two shapes Google uses, per zone:
  * at once, as an HTTP error whose body is {"error": {"code", "status", "message"}}:
    `exhausted_zones` -> 429 RESOURCE_EXHAUSTED, `unavailable_zones` -> 503 UNAVAILABLE,
    `create_errors[zone] = (HTTPStatus, message)` for anything else (400, 403, 404, ...);
  * later, as an accepted create whose Operation finishes with an error:
    `failed_operations[zone] = (google.rpc code, message)`, e.g. (8, "There is no more capacity
    in the zone ..."). The node is CREATING meanwhile and is gone once the operation failed; with
    `creation_polls = 0` the create's own answer is already the failed operation;
- answers can be slow or lost, per kind of call ("create", "get", "list", "delete",
  "operation"): `slow_answers[kind] = seconds` does the work, then waits that long before
  answering (past the client's timeout, the client gives up on a call that took effect);
  `lost_answers[kind] = n` does the work and then drops the connection without an answer, for the
  next n calls of that kind; `dropped_requests[kind] = n` drops the connection without doing the
  work (the call is still listed in `calls` and `create_calls`);
- delete removes the node at once and answers with a finished Operation;
- queued resources (`projects.locations.queuedResources`: create with `queuedResourceId`, get,
  list, delete with `force`) follow a scripted state sequence per zone, one step per GET of the
  request: `queued_script[zone]` is a list of QueuedResourceState names (default
  CREATING, ACCEPTED, PROVISIONING, ACTIVE), a step may be ("FAILED", google.rpc code, message)
  for `failedData.error`, and the last step repeats; ACTIVE creates the node (READY, its
  `queuedResource` naming the request; READY after `queued_node_polls` GETs of it). `queued_expire_zones`: the request waits
  (WAITING_FOR_RESOURCES) until its `queueingPolicy.validUntilDuration` is over, then FAILED with
  the expiry (code 4). A duplicate id in a zone is 409 ALREADY_EXISTS; delete without force is
  refused while the request still has a node (as Google does); `queued_overlaps` lists every
  create made while another request of that id was live in another zone (it must stay empty);
  `queued_invisible_gets = n` answers the next n GETs of an existing request 404, as a lookup
  that has not caught up with a create yet;
- a running slice can be lost the ways Google loses it: `set_state(name, "PREEMPTED")`,
  `preempt(name)` (the node PREEMPTED and its queued resource SUSPENDED by the SERVICE),
  `vanish(name)` (the node is simply gone).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import any_pb2, empty_pb2, json_format
from google.rpc import status_pb2

from backends.tpu_shapes import parse_slice

HostAddresses = list[str] | Callable[[str, int], list[str]]

_ZONE = r"projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
_NODES_RE = re.compile(rf"^/v2/{_ZONE}/nodes$")
_NODE_RE = re.compile(rf"^/v2/(?P<name>{_ZONE}/nodes/(?P<node_id>[^/]+))$")
_QUEUED_LIST_RE = re.compile(rf"^/v2/{_ZONE}/queuedResources$")
_QUEUED_RE = re.compile(rf"^/v2/(?P<name>{_ZONE}/queuedResources/(?P<qr_id>[^/]+))$")
_OPERATION_RE = re.compile(rf"^/v2/(?P<name>{_ZONE}/operations/[^/]+)$")


class FakeApiError(Exception):
    def __init__(self, code: HTTPStatus, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class _NodeRecord:
    def __init__(self, node: tpu_v2.Node, polls_left: int, create_op: str,
                 fails_with: tuple[int, str] | None = None):
        self.node = node
        self.polls_left = polls_left
        self.create_op = create_op
        self.fails_with = fails_with  # (google.rpc code, message) the create operation ends with


DEFAULT_QUEUED_SCRIPT = ["CREATING", "ACCEPTED", "PROVISIONING", "ACTIVE"]
QueuedStep = str | tuple[str, int, str]


class _QueuedRecord:
    def __init__(self, qr: tpu_v2.QueuedResource, script: list[QueuedStep], expires: float | None):
        self.qr = qr
        self.script = list(script)
        self.expires = expires  # epoch seconds when validUntilDuration runs out (expire zones only)
        self.step = 0


class FakeTpuServer:
    """The fake API. Attributes below are read on every request, so tests may change them live."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.creation_polls = 1
        self.stuck_creating = False
        self.exhausted_zones: set[str] = set()
        self.unavailable_zones: set[str] = set()
        self.create_errors: dict[str, tuple[HTTPStatus, str]] = {}
        self.failed_operations: dict[str, tuple[int, str]] = {}
        self.slow_answers: dict[str, float] = {}
        self.lost_answers: dict[str, int] = {}
        self.dropped_requests: dict[str, int] = {}
        self.host_addresses: HostAddresses = _default_addresses
        # None: endpoints carry no external address, so the backend falls back to the internal one.
        self.external_addresses: HostAddresses | None = None
        self.calls: list[tuple[str, str]] = []  # (method, path without the query string)
        self._create_names: list[str] = []
        self._queued_deletes: list[tuple[str, bool]] = []
        self.nodes: dict[str, _NodeRecord] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.queued: dict[str, _QueuedRecord] = {}
        self.queued_script: dict[str, list[QueuedStep]] = {}
        self.queued_expire_zones: set[str] = set()
        self.queued_node_polls = 0  # GETs of its node before a queued resource's node is READY
        self.queued_invisible_gets = 0  # the next n GETs of an existing request answer 404 (lag)
        self.queued_overlaps: list[tuple[str, str]] = []  # (new request, the live one elsewhere)
        self._op_seq = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeTpuServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-tpu", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def endpoint(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    # -- what tests inspect ----------------------------------------------------------------

    @property
    def create_calls(self) -> list[str]:
        """Node names of every create attempt, failed ones included, in call order."""
        with self.lock:
            return list(self._create_names)

    @property
    def delete_calls(self) -> list[str]:
        with self.lock:
            return [path[4:] for method, path in self.calls if method == "DELETE" and _NODE_RE.match(path)]

    @property
    def queued_create_calls(self) -> list[str]:
        """Queued-resource names of every create attempt, in call order."""
        with self.lock:
            return [n for n in self._create_names if "/queuedResources/" in n]

    @property
    def queued_delete_calls(self) -> list[tuple[str, bool]]:
        """(queued resource name, force) of every delete, in call order."""
        with self.lock:
            return list(self._queued_deletes)

    def queued_state(self, name: str) -> str | None:
        with self.lock:
            rec = self.queued.get(name)
            return tpu_v2.QueuedResourceState.State(rec.qr.state.state).name if rec else None

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

    # -- request handling ------------------------------------------------------------------

    @staticmethod
    def kind_of(method: str, raw_path: str) -> str:
        """Which kind of call a request is, as `slow_answers` and `lost_answers` name them."""
        path = urlsplit(raw_path).path
        if _NODES_RE.match(path):
            return "create" if method == "POST" else "list"
        if _NODE_RE.match(path):
            return "delete" if method == "DELETE" else "get"
        if _QUEUED_LIST_RE.match(path):
            return "queued_create" if method == "POST" else "queued_list"
        if _QUEUED_RE.match(path):
            return "queued_delete" if method == "DELETE" else "queued_get"
        return "operation" if _OPERATION_RE.match(path) else "other"

    def answer_fate(self, kind: str) -> tuple[float, bool]:
        """(seconds to wait before answering, whether to drop the answer) for one call of `kind`."""
        with self.lock:
            lost = self.lost_answers.get(kind, 0) > 0
            if lost:
                self.lost_answers[kind] -= 1
            return self.slow_answers.get(kind, 0.0), lost

    def drop_request(self, method: str, raw_path: str) -> bool:
        """True when this request is to be dropped unheard (recorded as a call, nothing done)."""
        kind = self.kind_of(method, raw_path)
        with self.lock:
            if self.dropped_requests.get(kind, 0) <= 0:
                return False
            self.dropped_requests[kind] -= 1
            url = urlsplit(raw_path)
            self.calls.append((method, url.path))
            if kind == "create":
                self._create_names.append(f"{url.path[4:]}/{parse_qs(url.query).get('nodeId', [''])[0]}")
            if kind == "queued_create":
                qr_id = parse_qs(url.query).get("queuedResourceId", [""])[0]
                self._create_names.append(f"{url.path[4:]}/{qr_id}")
            return True

    def handle(self, method: str, raw_path: str, body: bytes) -> tuple[HTTPStatus, str]:
        url = urlsplit(raw_path)
        with self.lock:
            self.calls.append((method, url.path))
            if method == "POST" and (m := _NODES_RE.match(url.path)):
                node_id = parse_qs(url.query).get("nodeId", [""])[0]
                self._create_names.append(f"{url.path[4:]}/{node_id}")
                return HTTPStatus.OK, self._create(m["project"], m["zone"], node_id, body)
            if method == "GET" and (m := _NODES_RE.match(url.path)):
                return HTTPStatus.OK, self._list(url.path[4:])
            if method == "GET" and (m := _NODE_RE.match(url.path)):
                return HTTPStatus.OK, self._get(m["name"])
            if method == "DELETE" and (m := _NODE_RE.match(url.path)):
                return HTTPStatus.OK, self._delete(m["name"])
            if method == "GET" and (m := _OPERATION_RE.match(url.path)):
                return HTTPStatus.OK, self._get_operation(m["name"])
            query = parse_qs(url.query)
            if method == "POST" and (m := _QUEUED_LIST_RE.match(url.path)):
                qr_id = query.get("queuedResourceId", [""])[0]
                self._create_names.append(f"{url.path[4:]}/{qr_id}")
                return HTTPStatus.OK, self._create_queued(m["project"], m["zone"], qr_id, body)
            if method == "GET" and (m := _QUEUED_LIST_RE.match(url.path)):
                return HTTPStatus.OK, self._list_queued(url.path[4:])
            if method == "GET" and (m := _QUEUED_RE.match(url.path)):
                return HTTPStatus.OK, self._get_queued(m["name"])
            if method == "DELETE" and (m := _QUEUED_RE.match(url.path)):
                force = query.get("force", ["false"])[0].lower() == "true"
                self._queued_deletes.append((m["name"], force))
                return HTTPStatus.OK, self._delete_queued(m["name"], force)
        raise FakeApiError(HTTPStatus.NOT_FOUND, f"no such method: {method} {url.path}")

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
        if not node_id:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, "nodeId is required")
        if name in self.nodes:
            raise FakeApiError(HTTPStatus.CONFLICT, f"node {name} already exists")
        node = tpu_v2.Node.from_json(body or b"{}", ignore_unknown_fields=True)
        shape = parse_slice(node.accelerator_type)
        if shape is None:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, f"unknown accelerator type {node.accelerator_type!r}")
        node.name = name
        node.state = tpu_v2.Node.State.CREATING
        op_name = self._new_operation(parent, "create", name)
        self.nodes[name] = _NodeRecord(node, self.creation_polls, op_name, self.failed_operations.get(zone))
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

    def _get_operation(self, name: str) -> str:
        op = self.operations.get(name)
        if op is None:
            raise FakeApiError(HTTPStatus.NOT_FOUND, f"operation {name} not found")
        rec = self.nodes.get(op["target"])
        if op["verb"] == "create" and rec is not None:
            self._maybe_ready(rec, count_poll=True)
        return self._operation_json(name)

    # -- queued resources ----------------------------------------------------------------------

    def _create_queued(self, project: str, zone: str, qr_id: str, body: bytes) -> str:
        parent = f"projects/{project}/locations/{zone}"
        name = f"{parent}/queuedResources/{qr_id}"
        if not qr_id:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, "queuedResourceId is required")
        if zone in self.exhausted_zones:
            raise FakeApiError(HTTPStatus.TOO_MANY_REQUESTS, f"There is no more capacity in the zone {zone!r}")
        if zone in self.create_errors:
            raise FakeApiError(*self.create_errors[zone])
        if name in self.queued:
            raise FakeApiError(HTTPStatus.CONFLICT, f"queued resource {name} already exists")
        qr = tpu_v2.QueuedResource.from_json(body or b"{}", ignore_unknown_fields=True)
        specs = list(qr.tpu.node_spec)
        if len(specs) != 1 or not specs[0].node_id or parse_slice(specs[0].node.accelerator_type) is None:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, "tpu.nodeSpec needs one nodeId and a known acceleratorType")
        if specs[0].parent != parent:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, f"nodeSpec.parent must be {parent}")
        for other, rec in self.queued.items():
            if other.rsplit("/", 1)[1] == qr_id and self._state_of(rec) not in ("FAILED", "SUSPENDED"):
                self.queued_overlaps.append((name, other))
        qr.name = name
        qr.create_time = datetime.now(UTC)
        expires = None
        if zone in self.queued_expire_zones:
            valid = qr.queueing_policy.valid_until_duration
            seconds = valid.total_seconds() if valid else 7 * 24 * 3600
            expires = time.time() + seconds
        rec = _QueuedRecord(qr, self.queued_script.get(zone, DEFAULT_QUEUED_SCRIPT), expires)
        self.queued[name] = rec
        self._advance_queued(rec, count_poll=False)
        op_name = self._new_operation(parent, "create", name)
        self.operations[op_name]["queued"] = True
        return self._operation_json(op_name)

    def _get_queued(self, name: str) -> str:
        rec = self.queued.get(name)
        if rec is not None and self.queued_invisible_gets > 0:
            self.queued_invisible_gets -= 1
            rec = None
        if rec is None:
            raise FakeApiError(HTTPStatus.NOT_FOUND, f"queued resource {name} not found")
        self._advance_queued(rec, count_poll=True)
        return tpu_v2.QueuedResource.to_json(rec.qr)

    def _list_queued(self, parent: str) -> str:
        found = [json.loads(tpu_v2.QueuedResource.to_json(r.qr))
                 for n, r in self.queued.items() if n.startswith(parent + "/")]
        return json.dumps({"queuedResources": found})

    def _delete_queued(self, name: str, force: bool) -> str:
        rec = self.queued.get(name)
        if rec is None:
            raise FakeApiError(HTTPStatus.NOT_FOUND, f"queued resource {name} not found")
        owned = [n for n, r in self.nodes.items() if r.node.queued_resource == name]
        if owned and not force:
            raise FakeApiError(HTTPStatus.BAD_REQUEST,
                               f"queued resource {name} has nodes; delete them first or set force")
        for n in owned:  # force: the nodes first, then the request
            del self.nodes[n]
        del self.queued[name]
        parent = name.rsplit("/queuedResources/", 1)[0]
        return self._operation_json(self._new_operation(parent, "delete", name))

    @staticmethod
    def _state_of(rec: _QueuedRecord) -> str:
        return tpu_v2.QueuedResourceState.State(rec.qr.state.state).name

    def _set_queued(self, rec: _QueuedRecord, state: str, error: tuple[int, str] | None = None,
                    initiator: str = "") -> None:
        rec.qr.state = tpu_v2.QueuedResourceState(
            state=tpu_v2.QueuedResourceState.State[state],
            state_initiator=tpu_v2.QueuedResourceState.StateInitiator[initiator] if initiator else None,
            failed_data=tpu_v2.QueuedResourceState.FailedData(
                error=status_pb2.Status(code=error[0], message=error[1])) if error else None,
        )

    def set_queued_state(self, name: str, state: str, initiator: str = "SERVICE") -> None:
        with self.lock:
            self._set_queued(self.queued[name], state, initiator=initiator)

    def _advance_queued(self, rec: _QueuedRecord, *, count_poll: bool) -> None:
        current = self._state_of(rec)
        if current in ("FAILED", "SUSPENDING", "SUSPENDED", "ACTIVE") and rec.step > 0:
            return  # final for the request (or changed by the test): stays as it is
        if rec.expires is not None:
            if time.time() < rec.expires:
                self._set_queued(rec, "WAITING_FOR_RESOURCES")
            else:
                valid = rec.qr.queueing_policy.valid_until_duration
                self._set_queued(rec, "FAILED", (4, (
                    f"Queued resource request expired: valid_until_duration {valid.total_seconds():.0f}s "
                    "reached before the resources became available")))
            rec.step = 1
            return
        step = rec.script[min(rec.step, len(rec.script) - 1)]
        if count_poll or rec.step == 0:
            rec.step += 1
        if isinstance(step, tuple):
            self._set_queued(rec, step[0], (step[1], step[2]))
            return
        self._set_queued(rec, step)
        if step == "ACTIVE":
            self._make_queued_node(rec)

    def _make_queued_node(self, rec: _QueuedRecord) -> None:
        spec = rec.qr.tpu.node_spec[0]
        name = f"{spec.parent}/nodes/{spec.node_id}"
        if name in self.nodes:
            return
        node = tpu_v2.Node(spec.node)
        node.name = name
        node.queued_resource = rec.qr.name
        node.state = tpu_v2.Node.State.CREATING
        self.nodes[name] = _NodeRecord(node, self.queued_node_polls, "")
        self._maybe_ready(self.nodes[name], count_poll=False)

    def _record(self, name: str) -> _NodeRecord:
        rec = self.nodes.get(name)
        if rec is None:
            raise FakeApiError(HTTPStatus.NOT_FOUND, f"node {name} not found")
        return rec

    def _maybe_ready(self, rec: _NodeRecord, *, count_poll: bool) -> None:
        if rec.node.state != tpu_v2.Node.State.CREATING or self.stuck_creating:
            return
        if rec.polls_left > 0:
            if count_poll:
                rec.polls_left -= 1
            return
        if rec.fails_with is not None:
            # As Google does for a stockout: the operation ends with the error, no node is left.
            self.operations[rec.create_op]["error"] = rec.fails_with
            del self.nodes[rec.node.name]
            return
        node_id = rec.node.name.rsplit("/", 1)[1]
        hosts = parse_slice(rec.node.accelerator_type).hosts
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

    def _new_operation(self, parent: str, verb: str, target: str) -> str:
        self._op_seq += 1
        name = f"{parent}/operations/operation-{self._op_seq}"
        self.operations[name] = {"verb": verb, "target": target}
        return name

    def _operation_json(self, name: str) -> str:
        op = self.operations[name]
        meta = any_pb2.Any()
        meta.Pack(tpu_v2.OperationMetadata.pb(tpu_v2.OperationMetadata(target=op["target"], verb=op["verb"])))
        msg = operations_pb2.Operation(name=name, metadata=meta)
        if op["verb"] == "delete":
            msg.done = True
            msg.response.Pack(empty_pb2.Empty())
        elif "error" in op:
            code, message = op["error"]
            msg.done = True
            msg.error.CopyFrom(status_pb2.Status(code=code, message=message))
        elif op.get("queued"):
            # Google answers a queued-resource create once the request is recorded.
            qrec = self.queued.get(op["target"])
            if qrec is not None:
                msg.done = True
                msg.response.Pack(tpu_v2.QueuedResource.pb(qrec.qr))
        else:
            rec = self.nodes.get(op["target"])
            if rec is not None and rec.node.state == tpu_v2.Node.State.READY:
                msg.done = True
                msg.response.Pack(tpu_v2.Node.pb(rec.node))
        return json_format.MessageToJson(msg)


def _default_addresses(node_id: str, hosts: int) -> list[str]:
    return [f"10.200.0.{k + 2}" for k in range(hosts)]


def _resolve(addresses: HostAddresses, node_id: str, hosts: int) -> list[str]:
    out = addresses(node_id, hosts) if callable(addresses) else list(addresses)
    if len(out) < hosts:
        raise FakeApiError(
            HTTPStatus.INTERNAL_SERVER_ERROR, f"fake configured with {len(out)} addresses for {hosts} hosts"
        )
    return out[:hosts]


def _handler_for(server: FakeTpuServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client's session expects

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if server.drop_request(self.command, self.path):
                self.close_connection = True
                self.connection.shutdown(2)
                return
            delay, lost = server.answer_fate(server.kind_of(self.command, self.path))
            try:
                status, text = server.handle(self.command, self.path, body)
            except FakeApiError as exc:
                status = exc.code
                text = json.dumps(
                    {
                        "error": {
                            "code": exc.code.value,
                            "status": _grpc_status(exc.code),
                            "message": exc.message,
                        }
                    }
                )
            if lost:
                # The work is done; the caller never hears of it.
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if delay:
                time.sleep(delay)
            data = text.encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                self.close_connection = True  # the client gave up waiting (its timeout)

        do_GET = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            pass  # keep test output clean

    return Handler


def _grpc_status(code: HTTPStatus) -> str:
    return {
        HTTPStatus.BAD_REQUEST: "INVALID_ARGUMENT",
        HTTPStatus.UNAUTHORIZED: "UNAUTHENTICATED",
        HTTPStatus.FORBIDDEN: "PERMISSION_DENIED",
        HTTPStatus.NOT_FOUND: "NOT_FOUND",
        HTTPStatus.CONFLICT: "ALREADY_EXISTS",
        HTTPStatus.TOO_MANY_REQUESTS: "RESOURCE_EXHAUSTED",
        HTTPStatus.SERVICE_UNAVAILABLE: "UNAVAILABLE",
    }.get(code, "INTERNAL")


@pytest.fixture
def fake_tpu() -> Iterator[FakeTpuServer]:
    server = FakeTpuServer().start()
    try:
        yield server
    finally:
        server.stop()
