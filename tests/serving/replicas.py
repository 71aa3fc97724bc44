"""Stand-in replicas (real aiohttp servers, each in a thread with its own loop, on a loopback
address of its own as local instances have) and the endpoint process the tests talk to."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from aiohttp import WSMsgType, web

ROOT = Path(__file__).resolve().parent.parent.parent
# replicas' addresses: a /24 of 127/8 per test process, so parallel test processes do not collide
NET = f"127.{100 + os.getpid() % 100}.{os.getpid() % 250}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Replica:
    """One replica: answers /who with its name and the headers it got, streams SSE, echoes bodies."""

    def __init__(self, name: str, host: str, port: int):
        self.name, self.host, self.port = name, host, port
        self.hits = 0
        self.loop = asyncio.new_event_loop()
        self._runner = None
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self._started.wait(10), f"replica {name} did not start"

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._started.set()
        self.loop.run_forever()

    async def _start(self):
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, reuse_address=True).start()

    def stop(self):
        if not self.thread.is_alive():
            return

        async def _stop():
            await self._runner.cleanup()
        asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def handle(self, request: web.Request):
        self.hits += 1
        tail = request.match_info["tail"]
        if tail.endswith("sse"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for i in range(3):
                await response.write(f"data: {i} {time.time():.6f}\n\n".encode())
                await asyncio.sleep(0.5)
            await response.write_eof()
            return response
        if tail.endswith("endless"):
            response = web.StreamResponse()
            await response.prepare(request)
            try:
                while True:
                    await response.write(b"x" * 1024)
                    await asyncio.sleep(0.01)
            except ConnectionResetError:  # the endpoint cut it, as it should
                return response
        if tail.endswith("malformed"):
            request.transport.write(b"HTTP/1.1 2oo NOT A STATUS\r\nthis is not a header line\r\n\r\n")
            request.transport.close()
            await asyncio.sleep(0.1)
            return web.Response()
        if tail.endswith("cookies"):  # an application setting the console's cookies, and its own
            response = web.Response(text="cookies")
            for cookie in ("sessionid=replica", "csrftoken=replica", "wide=1; Domain=example.com", "app=1; Path=/"):
                response.headers.add("Set-Cookie", cookie)
            return response
        if tail.endswith("silent"):
            await asyncio.sleep(60)
        if tail.endswith("ws"):
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await ws.send_str(f"{self.name}:{msg.data}")
            return ws
        body = await request.read()
        return web.json_response({"replica": self.name, "path": request.raw_path, "method": request.method,
                                  "headers": dict(request.headers), "body_length": len(body)})


class Endpoint:
    """`python -m django serve_endpoint` against the test database."""

    def __init__(self, database_url: str, env: dict | None = None, log: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        full = {**os.environ, "DATABASE_URL": database_url, "MUSTER_METRICS_OPEN": "1",
                "DJANGO_SETTINGS_MODULE": "muster.settings", "PYTHONUNBUFFERED": "1", **(env or {})}
        out = log.open("ab") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "django", "serve_endpoint", "--bind", f"127.0.0.1:{self.port}"],
                                     cwd=ROOT, env=full, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"the endpoint did not listen: {self.output()}")

    def output(self) -> str:
        return self.log.read_text() if self.log and self.log.exists() else ""

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def answer(response) -> dict:
    try:
        return response.json()
    except json.JSONDecodeError:
        return {"text": response.text}
