"""The fake's HTTP server: lifecycle, what tests inspect, and routing each request to its call."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fake_tpu.errors import FakeApiError, grpc_status
from tests.fake_tpu.nodes import HostAddresses, NodeRecord, NodesMixin, default_addresses
from tests.fake_tpu.operations import OperationsMixin
from tests.fake_tpu.queued import QueuedMixin, QueuedRecord, QueuedStep

_ZONE = r"projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
_NODES_RE = re.compile(rf"^/v2/{_ZONE}/nodes$")
_NODE_RE = re.compile(rf"^/v2/(?P<name>{_ZONE}/nodes/(?P<node_id>[^/]+))$")
_QUEUED_LIST_RE = re.compile(rf"^/v2/{_ZONE}/queuedResources$")
_QUEUED_RE = re.compile(rf"^/v2/(?P<name>{_ZONE}/queuedResources/(?P<qr_id>[^/]+))$")
_OPERATION_RE = re.compile(rf"^/v2/(?P<name>{_ZONE}/operations/[^/]+)$")



class FakeTpuServer(NodesMixin, QueuedMixin, OperationsMixin):
    """The fake API. Attributes below are read on every request, so tests may change them live."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.creation_polls = 1
        self.creation_seconds = 0.0  # a created node stays CREATING at least this long (Google: minutes)
        self.created_at: dict[str, float] = {}  # node name -> epoch seconds its create was taken
        self.stuck_creating = False
        self.exhausted_zones: set[str] = set()
        self.unavailable_zones: set[str] = set()
        self.create_errors: dict[str, tuple[HTTPStatus, str]] = {}
        self.node_create_errors: dict[str, tuple[HTTPStatus, str]] = {}  # by node id ending, in every zone
        self.failed_operations: dict[str, tuple[int, str]] = {}
        self.slow_answers: dict[str, float] = {}
        self.lost_answers: dict[str, int] = {}
        self.dropped_requests: dict[str, int] = {}
        self.host_addresses: HostAddresses = default_addresses
        # None: endpoints carry no external address, so the backend falls back to the internal one.
        self.external_addresses: HostAddresses | None = None
        self.calls: list[tuple[str, str]] = []  # (method, path without the query string)
        self._create_names: list[str] = []
        self._queued_deletes: list[tuple[str, bool]] = []
        self.nodes: dict[str, NodeRecord] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.queued: dict[str, QueuedRecord] = {}
        self.queued_script: dict[str, list[QueuedStep]] = {}
        self.queued_expire_zones: set[str] = set()
        self.queued_node_polls = 0  # GETs of its node before a queued resource's node is READY
        self.queued_invisible_gets = 0  # the next n GETs of an existing request answer 404 (lag)
        self.queued_overlaps: list[tuple[str, str]] = []  # (new request, the live one elsewhere)
        self.queued_bodies: dict[str, dict] = {}  # each queued create's body as sent
        self.flex_reclaimed: list[str] = []  # flex-start requests whose run time ended (SUSPENDED)
        self._op_seq = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeTpuServer:
        self._httpd = _Server(("127.0.0.1", 0), _handler_for(self))
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
            self.reclaim_flex()
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


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a caller that went away mid-call (a worker killed by the chaos bench): nothing to say
        super().handle_error(request, client_address)


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
                            "status": grpc_status(exc.code),
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

