"""A stand-in for the Muster server speaking the REST contract over real HTTP, for client tests.

Each test declares the endpoints it needs with canned answers; every request is recorded so a
test can check exactly what the client sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Answer = tuple[int, Any]


@dataclass
class Recorded:
    method: str
    project: str
    path: str  # relative to /api/projects/{project}/
    query: dict[str, str]
    body: Any
    headers: dict[str, str]


@dataclass
class _Route:
    answers: list[Answer | Callable[[Recorded], Answer]]
    served: int = 0

    def next(self, request: Recorded) -> Answer:
        # Successive calls get successive answers; the last one repeats (a run stays `done`).
        answer = self.answers[min(self.served, len(self.answers) - 1)]
        self.served += 1
        return answer(request) if callable(answer) else answer


@dataclass
class FakeApi:
    routes: dict[tuple[str, str], _Route] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    url: str = ""

    def on(self, method: str, path: str, *answers: Answer | Callable[[Recorded], Answer]) -> None:
        self.routes[(method, path)] = _Route(list(answers))

    def calls(self, method: str, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path == path]

    def answer(self, request: Recorded) -> Answer:
        self.requests.append(request)
        route = self.routes.get((request.method, request.path))
        if route is None:
            return 404, {"detail": "Not found."}
        return route.next(request)


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    prefix = "/api/projects/"

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            project, _, rest = parts.path.removeprefix(prefix).partition("/")
            request = Recorded(
                method=self.command, project=project, path=rest,
                query={k: v[-1] for k, v in parse_qs(parts.query).items()},
                body=json.loads(raw) if raw else None, headers=dict(self.headers),
            )
            status, body = api.answer(request)
            payload = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_DELETE = _serve

        def log_message(self, *args: object) -> None:  # keep test output clean
            pass

    return Handler


def start(api: FakeApi) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    server.daemon_threads = True
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll interval: shutdown() waits for it, once per test.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server
