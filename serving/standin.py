"""A stand-in SGLang worker: what the `smg` router and Muster's router sync ask of an SGLang HTTP
worker, answered by a small stdlib-only server, so PD services run and are tested on one machine.

    python3 -m serving.standin --port 8000 [--host ADDR] [--role prefill|decode|regular]
                               [--bootstrap-port 8998] [--model NAME] [--delay SECONDS]
    python3 serving/standin.py ...   (the same, by path: it imports nothing of Muster's)

What it answers (learned from running smg 1.13 against it and from dstack 0.22.5's probe):
- `GET /health`, `/health_generate`: 200 (smg's health checks).
- `GET /v1/models` (owned_by "sglang": how smg and dstack tell the runtime), `/server_info` and
  `/get_server_info` (status "ready", `disaggregation_mode`, `disaggregation_bootstrap_port`: what
  dstack and Muster's sync read the role from), `/model_info`, `/get_model_info`.
- `POST /generate` (SGLang's native API, what smg sends to both workers of a PD pair with the
  bootstrap host, port and room injected) and `POST /v1/chat/completions`, `/v1/completions`;
  `"stream": true` answers server-sent events ending in `data: [DONE]`.
- `GET /metrics`: Prometheus text with `sglang:num_queue_reqs` (and running requests).

A prefill worker listens on its bootstrap port too (the KV-transfer rendezvous, HTTP here): a
decode worker given a bootstrap host, port and room asks the prefill for that room's "KV" there and
puts what it got in its answer (`meta_info.prefill`), so an answer shows it went prefill -> decode.

For tests: `POST /standin/queue {"value": N}` sets the queue gauge (or STANDIN_QUEUE in the env at
start), `POST /standin/delay {"seconds": S}` makes every generation that slow, `GET /standin/log`
lists the requests seen (path and bootstrap room). `--fail-generate` answers the probes but 500 to
every generation (a worker smg cannot use).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1 << 20


class State:
    def __init__(self, args):
        self.role = args.role
        self.bootstrap_port = args.bootstrap_port
        self.model = args.model
        self.name = args.name or f"{args.role}@{args.host}:{args.port}"
        self.delay = args.delay
        self.fail_generate = args.fail_generate
        self.queue = float(os.environ.get("STANDIN_QUEUE", "0") or 0)
        self.running = 0
        self.log: list[dict] = []
        self.rooms: dict[str, dict] = {}  # bootstrap room -> what the prefill "computed"
        self.lock = threading.Condition()


def _answer(handler, status: int, body, content_type="application/json"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _prompt(body: dict) -> str:
    if "messages" in body:
        return " ".join(str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict))
    text = body.get("text", body.get("prompt", ""))
    return text if isinstance(text, str) else json.dumps(text)


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # one line per request on stderr: the job's log
            sys.stderr.write(f"standin {state.name}: {fmt % args}\n")

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise ValueError("body too large")
            raw = self.rfile.read(length) if length else b""
            try:
                value = json.loads(raw or b"{}")
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate", "/liveness", "/readiness"):
                return _answer(self, 200, b"", "text/plain")
            if path == "/v1/models":
                return _answer(self, 200, {"object": "list", "data": [
                    {"id": state.model, "object": "model", "created": 0, "owned_by": "sglang",
                     "root": state.model, "max_model_len": 4096}]})
            if path in ("/server_info", "/get_server_info"):
                return _answer(self, 200, {
                    "status": "ready", "model_path": state.model, "served_model_name": state.model,
                    "tokenizer_path": state.model, "disaggregation_mode": state.role if state.role != "regular"
                    else "null", "disaggregation_bootstrap_port": state.bootstrap_port, "dp_size": 1, "tp_size": 1,
                    "version": "standin", "max_total_num_tokens": 4096, "max_running_requests": 64})
            if path in ("/model_info", "/get_model_info"):
                return _answer(self, 200, {"model_path": state.model, "tokenizer_path": state.model,
                                           "is_generation": True, "served_model_name": state.model,
                                           "model_type": "standin", "architectures": ["StandIn"]})
            if path == "/metrics":
                labels = f'{{model_name="{state.model}",engine_type="unified",role="{state.role}"}}'
                text = ("# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
                        "# TYPE sglang:num_queue_reqs gauge\n"
                        f"sglang:num_queue_reqs{labels} {state.queue}\n"
                        "# HELP sglang:num_running_reqs The number of running requests.\n"
                        "# TYPE sglang:num_running_reqs gauge\n"
                        f"sglang:num_running_reqs{labels} {state.running}\n")
                return _answer(self, 200, text.encode(), "text/plain; version=0.0.4")
            if path == "/standin/log":
                with state.lock:
                    return _answer(self, 200, {"name": state.name, "role": state.role, "log": state.log[-200:]})
            return _answer(self, 404, {"error": f"no route {path}"})

        def do_POST(self):
            path = self.path.split("?")[0]
            try:
                body = self._body()
            except ValueError as exc:
                return _answer(self, 413, {"error": str(exc)})
            if path == "/standin/queue":
                state.queue = float(body.get("value", 0))
                return _answer(self, 200, {"queue": state.queue})
            if path == "/standin/delay":
                state.delay = float(body.get("seconds", 0))
                return _answer(self, 200, {"delay": state.delay})
            if path in ("/generate", "/v1/chat/completions", "/v1/completions"):
                return self._generate(path, body)
            if path in ("/flush_cache", "/abort_request"):
                return _answer(self, 200, {})
            return _answer(self, 404, {"error": f"no route {path}"})

        def _generate(self, path: str, body: dict):
            room = body.get("bootstrap_room")
            room = room[0] if isinstance(room, list) and room else room
            entry = {"path": path, "room": room, "at": time.time()}
            with state.lock:
                state.log.append(entry)
                state.running += 1
            try:
                if state.fail_generate:
                    return _answer(self, 500, {"error": "this stand-in refuses generation (--fail-generate)"})
                if state.delay:
                    time.sleep(state.delay)
                prompt = _prompt(body)
                meta = {"id": f"standin-{int(time.time() * 1e6)}", "finish_reason": {"type": "stop"},
                        "prompt_tokens": len(prompt.split()), "completion_tokens": 4, "served_by": state.name,
                        "role": state.role}
                if state.role == "prefill" and room is not None:
                    with state.lock:
                        state.rooms[str(room)] = {"prefill": state.name, "prompt_tokens": meta["prompt_tokens"]}
                        state.lock.notify_all()
                if state.role == "decode" and room is not None:
                    meta["prefill"] = _fetch_kv(body, room)
                words = ["stand-in", state.role, "says:", prompt[:200] or "hello"]
                text = " ".join(words)
                if body.get("stream"):
                    return self._stream(path, words, meta)
                if path == "/generate":
                    return _answer(self, 200, {"text": text, "meta_info": meta})
                return _answer(self, 200, _openai(path, text, meta, state.model))
            finally:
                with state.lock:
                    state.running -= 1

        def _stream(self, path: str, words: list[str], meta: dict):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            text = ""
            for i, word in enumerate(words):
                text += ("" if i == 0 else " ") + word
                last = i == len(words) - 1
                if path == "/generate":
                    chunk = {"text": text, "meta_info": {**meta, "finish_reason": meta["finish_reason"] if last else None}}
                else:
                    chunk = _openai_chunk(path, ("" if i == 0 else " ") + word, meta, state.model, last)
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def _openai(path, text, meta, model):
    usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": 4,
             "total_tokens": meta["prompt_tokens"] + 4}
    if path == "/v1/chat/completions":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "stop"}
        kind = "text_completion"
    return {"id": meta["id"], "object": kind, "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage, "served_by": meta["served_by"], "prefill": meta.get("prefill")}


def _openai_chunk(path, piece, meta, model, last):
    if path == "/v1/chat/completions":
        choice = {"index": 0, "delta": {"content": piece}, "finish_reason": "stop" if last else None}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": piece, "finish_reason": "stop" if last else None}
        kind = "text_completion"
    return {"id": meta["id"], "object": kind, "created": int(time.time()), "model": model, "choices": [choice]}


def _fetch_kv(body: dict, room) -> dict | None:
    """The decode side of the rendezvous: ask the prefill at the bootstrap host and port for the room."""
    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
    host = host[0] if isinstance(host, list) and host else host
    port = port[0] if isinstance(port, list) and port else port
    if not host or not port:
        return None
    host = f"[{host}]" if ":" in str(host) else host
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/kv/{room}", timeout=10) as got:
            return json.loads(got.read(MAX_BODY))
    except (OSError, ValueError) as exc:
        return {"error": f"no KV from the prefill at {host}:{port}: {exc}"}


def make_bootstrap_handler(state: State):
    class Bootstrap(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            sys.stderr.write(f"standin {state.name} bootstrap: {fmt % args}\n")

        def do_GET(self):
            room = self.path.rsplit("/", 1)[-1]
            deadline = time.monotonic() + 10  # the prefill's request and the decode's arrive together
            with state.lock:
                while room not in state.rooms and time.monotonic() < deadline:
                    state.lock.wait(deadline - time.monotonic())
                found = state.rooms.pop(room, None)
            if found is None:
                return _answer(self, 404, {"error": f"no prefill for room {room}"})
            return _answer(self, 200, {**found, "room": room})

    return Bootstrap


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="A stand-in SGLang worker (stdlib only)")
    parser.add_argument("--host", default=os.environ.get("DSTACK_NODE_IP") or "127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--role", choices=("prefill", "decode", "regular"), default="regular")
    parser.add_argument("--bootstrap-port", type=int, default=None)
    parser.add_argument("--model", default="standin/tiny")
    parser.add_argument("--name", default="")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--fail-generate", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "prefill" and args.bootstrap_port is None:
        args.bootstrap_port = 8998  # SGLang's default disaggregation bootstrap port
    state = State(args)
    servers = [ThreadingHTTPServer((args.host, args.port), make_handler(state))]
    if args.role == "prefill":
        servers.append(ThreadingHTTPServer((args.host, args.bootstrap_port), make_bootstrap_handler(state)))
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stderr.write(f"standin {state.name}: serving {args.role} on {args.host}:{args.port}"
                     f"{f' (bootstrap {args.bootstrap_port})' if args.role == 'prefill' else ''}\n")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0



if __name__ == "__main__":
    raise SystemExit(main())
