"""One request to a service, forwarded to one of its ready replicas, streamed both ways.

Nothing is buffered whole: the request body goes to the replica as the client sends it (with its
Content-Length when it had one, else chunked), the response comes back chunk by chunk as the
replica writes it (server-sent events arrive as sent), and a WebSocket upgrade becomes two
WebSockets pumped into each other. Bodies pass as they are (no decompression either way).

Retries: a replica that refuses the connection (or cannot be reached) got nothing, so the request,
whatever its method, goes to the next replica and the refusing one leaves the pool (table.py). A
replica that drops the connection before answering gets the request again elsewhere only when it
is idempotent (RFC 9110 9.2.2) and its body was not yet sent. Each replica is tried once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import WSMsgType, web
from multidict import CIMultiDict

from serving.proxy import upstream as upstream_client
from serving.proxy.paths import Refused, response_headers
from serving.proxy.table import Entry

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
SMALL = 1 << 16  # bytes of a known-length answer sent back in one write


@dataclass(frozen=True)
class Limits:
    connect_timeout: float
    read_timeout: float
    client_timeout: float
    max_body: int
    # the console's session and CSRF cookie names: a replica's Set-Cookie for them is dropped
    muster_cookies: frozenset[str] = frozenset()


class _Body:
    """The request body as the replica reads it, counted against the limit as it passes."""

    def __init__(self, request: web.BaseRequest, limits: Limits):
        self.request, self.limits = request, limits
        self.started = False
        self.problem: Refused | None = None

    async def chunks(self):
        self.started = True
        sent = 0
        while True:
            try:
                chunk = await asyncio.wait_for(self.request.content.readany(), self.limits.client_timeout)
            except TimeoutError:
                self.problem = Refused(408, f"the request body stalled for {self.limits.client_timeout:g}s")
                raise
            if not chunk:
                return
            sent += len(chunk)
            if sent > self.limits.max_body:
                self.problem = Refused(413, f"the request body is larger than {self.limits.max_body} bytes "
                                            "(MUSTER_ENDPOINT_MAX_BODY)")
                raise self.problem
            yield chunk


class Upstream:
    """What a forward reports back: the replica used, when its answer began (time.monotonic) and
    what went wrong (the metrics' error kind)."""

    def __init__(self):
        self.replica = None
        self.first_byte: float | None = None
        self.error: str | None = None


def _failed(status: int, message: str) -> Refused:
    return Refused(status, message)


async def forward(request: web.BaseRequest, entry: Entry, path: str, headers: list, session: aiohttp.ClientSession,
                  pool: upstream_client.Pool, limits: Limits, report: Upstream, tunnels) -> web.StreamResponse:
    websocket = request.headers.get("Upgrade", "").lower() == "websocket"
    body = _Body(request, limits) if request.body_exists and not websocket else None
    if body is not None and (request.content_length or 0) > limits.max_body:
        raise Refused(413, f"the request body is larger than {limits.max_body} bytes (MUSTER_ENDPOINT_MAX_BODY)")
    tried: set[int] = set()
    while True:
        replica = entry.pick(tried)
        if replica is None:
            if tried:
                report.error = "replicas_failed"
                raise _failed(502, "every ready replica of the service refused or dropped the connection")
            return None  # no ready replica: the caller decides (503, or wait for a cold start)
        tried.add(replica.job_id)
        report.replica = replica
        upstream, dropped = None, False
        for through_ssh in (False, True):
            if not through_ssh and tunnels.prefers(replica):
                continue  # its host needed the SSH path lately
            if through_ssh and not replica.ssh:
                break
            tunnel = await tunnels.tunnel(replica) if through_ssh else None
            if through_ssh and tunnel is None:
                break
            # through the tunnel the replica still gets its own address as Host
            sent = [*headers, ("Host", replica.address)] if through_ssh else headers
            try:
                if websocket:
                    return await _websocket(request, tunnel.session() if tunnel else session,
                                            f"http://{replica.address}{path}", sent, report, limits.max_body)
                upstream = await pool.request(
                    f"ssh/{replica.instance_id}/{replica.address}" if tunnel else replica.address, request.method,
                    path, sent, body.chunks() if body else None, request.content_length if body else None,
                    limits.read_timeout, opener=tunnel.open_socket if tunnel else None)
                break
            except upstream_client.ConnectFailed:
                continue  # refused or unreachable there: it got nothing; the SSH path, or another replica
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
                continue  # the same for a WebSocket's handshake
            except upstream_client.Dropped:
                if body is not None and body.problem is not None:
                    raise body.problem from None
                if request.method in IDEMPOTENT and (body is None or not body.started):
                    dropped = True  # another replica, without ejecting this one
                    break
                report.error = "replica_error"
                raise _failed(502, "the replica closed the connection before answering") from None
            except TimeoutError:
                if body is not None and body.problem is not None:
                    raise body.problem from None
                report.error = "timeout"
                raise _failed(504, f"the replica did not answer within {limits.read_timeout:g}s") from None
            except upstream_client.Malformed as exc:
                report.error = "replica_error"
                raise _failed(502, f"the replica's answer is not valid HTTP: {exc}") from None
            except aiohttp.ClientResponseError as exc:  # a WebSocket handshake refused or malformed
                report.error = "replica_error"
                raise _failed(502, f"the replica's answer is not valid HTTP: {exc.message}") from None
            except Refused:
                raise
            except (OSError, aiohttp.ClientError) as exc:
                if body is not None and body.problem is not None:
                    raise body.problem from None
                report.error = "replica_error"
                raise _failed(502, f"forwarding to the replica failed: {exc}") from None
        if upstream is None:
            if not dropped:
                entry.eject(replica)
            if body is not None and body.started:
                break
            continue
        report.first_byte = time.monotonic()
        return await _stream_back(request, upstream, report, limits.read_timeout, limits.muster_cookies)
    report.error = "replica_error"
    raise _failed(502, "the replica refused the connection after the request body was sent")


async def _stream_back(request: web.BaseRequest, upstream: upstream_client.Answer, report: Upstream,
                       read_timeout: float, muster_cookies: frozenset[str]):
    headers = CIMultiDict(response_headers(CIMultiDict(upstream.headers), muster_cookies))
    length = upstream.length
    broken = (upstream_client.Dropped, upstream_client.Malformed, TimeoutError)
    if length is not None and length <= SMALL and request.method != "HEAD":
        # a small answer of known length goes back in one write with its headers, as nginx's
        # proxy buffers do; a stream (no length, or chunked) or a larger body is never held
        try:
            body = b"".join([piece async for piece in upstream.chunks(read_timeout)])
        except broken:
            upstream.release()
            report.error = "replica_error"
            raise Refused(502, "the replica's answer broke off before its Content-Length") from None
        upstream.release()
        return web.Response(status=upstream.code, reason=upstream.reason, headers=headers, body=body)
    response = web.StreamResponse(status=upstream.code, reason=upstream.reason, headers=headers)
    if length is not None:
        response.content_length = length
    try:
        await response.prepare(request)
        async for chunk in upstream.chunks(read_timeout):
            await response.write(chunk)
        await response.write_eof()
    except broken as exc:
        # the answer began: the only way left to tell the client it is cut short is to cut the
        # connection without the final chunk (or before Content-Length bytes)
        report.error = "timeout" if isinstance(exc, TimeoutError) else "replica_error"
        if request.transport is not None:
            request.transport.close()
    except ConnectionResetError:  # the client went away
        pass
    finally:
        upstream.release()
    return response


async def _websocket(request, session, url, headers, report: Upstream, max_message: int):
    # a message is held whole before it is passed on: MUSTER_ENDPOINT_MAX_BODY bounds it both ways
    # (a larger one closes the WebSocket with 1009, message too big)
    protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    upstream = await session.ws_connect(url, headers=headers, protocols=protocols, autoping=False,
                                        max_msg_size=max_message,
                                        timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0))
    report.first_byte = time.monotonic()
    client = web.WebSocketResponse(protocols=[upstream.protocol] if upstream.protocol else (), autoping=False,
                                   max_msg_size=max_message)
    await client.prepare(request)

    async def pump(source, sink):
        async for message in source:
            if message.type == WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif message.type == WSMsgType.BINARY:
                await sink.send_bytes(message.data)
            elif message.type == WSMsgType.PING:
                await sink.ping(message.data)
            elif message.type == WSMsgType.PONG:
                await sink.pong(message.data)

    tasks = [asyncio.ensure_future(pump(client, upstream)), asyncio.ensure_future(pump(upstream, client))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        code = upstream.close_code or client.close_code or 1000
        await upstream.close(code=code)
        await client.close(code=code)
    return client
