"""A lean HTTP/1.1 client for the endpoint's requests to replicas: kept connections per replica,
the request's head in one write, the answer's body handed on as it arrives.

aiohttp's client did the same at about a third of the endpoint's CPU per request (its request
objects, tracing, timers and payload machinery are built for far more than a proxy needs:
docs/performance.md); this is only what forwarding needs. WebSocket upgrades stay aiohttp's.

Errors map onto what forward.py already decides on: `ConnectFailed` (nothing was sent: another
replica may take the request), `Dropped` (the replica closed the connection before its answer
began), `Malformed` (the answer is not HTTP/1.x), TimeoutError (silence past the read timeout).
"""

from __future__ import annotations

import asyncio
from collections import deque

MAX_HEAD = 64 << 10
MAX_LINE = 4096  # a chunk size line or a trailer line
HIGH_WATER = 1 << 20  # bytes of an answer held before the replica is asked to wait (pause_reading)
IDLE_KEEP = 30.0


class ConnectFailed(Exception):
    pass


class Dropped(Exception):
    pass


class Malformed(Exception):
    pass


class _Stale(Exception):
    """A kept connection found closed when used: try a new one."""


class Answer:
    def __init__(self, conn: _Conn, status: int, reason: str, headers: list[tuple[str, str]], length: int | None):
        self._conn, self.code, self.reason, self.headers, self.length = conn, status, reason, headers, length

    async def chunks(self, timeout: float):
        """The body's pieces as they arrive (chunked encoding undone), then the end."""
        conn = self._conn
        while True:
            if conn.pieces:
                piece = conn.pieces.popleft()
                conn.buffered -= len(piece)
                if conn.paused and conn.buffered < HIGH_WATER // 2:
                    conn.paused = False
                    conn.transport.resume_reading()
                yield piece
                continue
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.error
            conn.waiter = asyncio.get_running_loop().create_future()
            await asyncio.wait_for(conn.waiter, timeout)

    def release(self) -> None:
        """Back to the pool when the answer was read whole on a connection that stays open."""
        self._conn.finish()


class _Conn(asyncio.Protocol):
    def __init__(self, pool: Pool, key: str, head_request: bool):
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.head_request = head_request
        self.answer: Answer | None = None
        self.pieces: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.complete = False
        self.keep = True
        self.error: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.mode = ""  # "length", "chunked", "close" or "none" once the head is read
        self.remaining = 0
        self.chunk_state = "size"
        self.idle_handle: asyncio.TimerHandle | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.body_sent = True

    # asyncio.Protocol
    def connection_made(self, transport):
        self.transport = transport

    def pause_writing(self):
        self.writable.clear()

    def resume_writing(self):
        self.writable.set()

    def connection_lost(self, exc):
        self.keep = False
        if self.mode == "close" and self.answer is not None:
            self.complete = True
        elif not self.complete:
            self.error = Dropped(str(exc) if exc else "the replica closed the connection")
        self.writable.set()
        self._wake()
        self.pool.forget(self)

    def data_received(self, data: bytes):
        if self.answer is None:
            self.buffer += data
            self._head()
        else:
            self._body(bytes(data))

    # the answer
    def _wake(self):
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, error: BaseException):
        self.error, self.keep = error, False
        self._wake()
        if self.transport is not None:
            self.transport.close()

    def _head(self):
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD:
                self._fail(Malformed(f"the answer's head is larger than {MAX_HEAD} bytes"))
            return
        head, rest = bytes(self.buffer[:end]), bytes(self.buffer[end + 4:])
        self.buffer.clear()
        try:
            lines = head.decode("latin-1").split("\r\n")
            version, _, status_reason = lines[0].partition(" ")
            code, _, reason = status_reason.partition(" ")
            status = int(code)
            if not version.startswith("HTTP/1.") or not 100 <= status <= 599 or len(code) != 3:
                raise ValueError(lines[0])
            headers = []
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if not colon or not name or name != name.strip():
                    raise ValueError(line)
                headers.append((name, value.strip()))
        except ValueError as exc:
            self._fail(Malformed(f"not an HTTP/1.x answer: {str(exc)[:80]!r}"))
            return
        if 100 <= status < 200:  # 100 Continue and the like: the answer is the next head
            self.buffer += rest
            if self.buffer:
                self._head()
            return
        lower = {k.lower(): v for k, v in headers}
        connection = lower.get("connection", "").lower()
        self.keep = version == "HTTP/1.1" and "close" not in connection
        length = None
        if self.head_request or status in (204, 304):
            self.mode = "none"
            declared = lower.get("content-length", "")
            length = int(declared) if self.head_request and declared.isdigit() else None  # what a GET would get
        elif "chunked" in lower.get("transfer-encoding", "").lower():
            self.mode = "chunked"
        elif "content-length" in lower:
            if not lower["content-length"].isdigit():
                self._fail(Malformed("the answer's Content-Length is not a number"))
                return
            length = self.remaining = int(lower["content-length"])
            self.mode = "length"
        else:
            self.mode, self.keep = "close", False
        self.answer = Answer(self, status, reason, headers, length)
        if self.mode == "none" or (self.mode == "length" and self.remaining == 0):
            self.complete = True
        if rest:
            self._body(rest)
        self._wake()

    def _body(self, data: bytes):
        if self.complete:
            return  # bytes past the answer's end: the connection is not reused
        if self.mode == "length":
            data = data[: self.remaining]
            self.remaining -= len(data)
            self._piece(data)
            if self.remaining == 0:
                self.complete = True
        elif self.mode == "close":
            self._piece(data)
        elif self.mode == "chunked":
            self.buffer += data
            self._chunks()
        self._wake()

    def _piece(self, data: bytes):
        if data:
            self.pieces.append(data)
            self.buffered += len(data)
            if self.buffered > HIGH_WATER and not self.paused:
                self.paused = True
                self.transport.pause_reading()

    def _chunks(self):
        buffer = self.buffer
        while True:
            if self.chunk_state == "size":
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_LINE:
                        self._fail(Malformed("a chunk size line is too long"))
                    return
                try:
                    self.remaining = int(bytes(buffer[:end]).split(b";")[0].strip(), 16)
                except ValueError:
                    self._fail(Malformed("a chunk size is not hexadecimal"))
                    return
                del buffer[: end + 2]
                self.chunk_state = "data" if self.remaining else "trailer"
            elif self.chunk_state == "data":
                if not buffer:
                    return
                take = bytes(buffer[: self.remaining])
                del buffer[: len(take)]
                self.remaining -= len(take)
                self._piece(take)
                if self.remaining == 0:
                    self.chunk_state = "crlf"
            elif self.chunk_state == "crlf":
                if len(buffer) < 2:
                    return
                if buffer[:2] != b"\r\n":  # a chunk longer than its size said: the framing is lost
                    self._fail(Malformed("a chunk's data is not followed by CRLF"))
                    return
                del buffer[:2]
                self.chunk_state = "size"
            else:  # trailers, then the blank line that ends the answer; `remaining` (0 after the
                # last chunk) counts the trailer's bytes, held to MAX_LINE as a size line is
                end = buffer.find(b"\r\n")
                if self.remaining + (len(buffer) if end < 0 else end) > MAX_LINE:
                    self._fail(Malformed("a chunked answer's trailer is too long"))
                    return
                if end < 0:
                    return
                line = bytes(buffer[:end])
                del buffer[: end + 2]
                self.remaining += end + 2
                if not line:
                    self.complete = True
                    return

    def finish(self):
        # a body still being sent (a replica that answered before reading it all) spoils the connection
        if self.complete and self.keep and self.body_sent and self.error is None and not self.buffer \
                and self.transport is not None and not self.transport.is_closing():
            self.pool.put_back(self)
        elif self.transport is not None:
            self.transport.close()

    def reset(self, head_request: bool):
        self.head_request, self.answer, self.complete, self.mode = head_request, None, False, ""
        self.pieces.clear()
        self.buffered, self.error, self.waiter, self.chunk_state = 0, None, None, "size"


class Pool:
    def __init__(self, connect_timeout: float):
        self.connect_timeout = connect_timeout
        self.idle: dict[str, list[_Conn]] = {}

    def put_back(self, conn: _Conn):
        loop = asyncio.get_running_loop()
        conn.idle_handle = loop.call_later(IDLE_KEEP, conn.transport.close)
        self.idle.setdefault(conn.key, []).append(conn)

    def forget(self, conn: _Conn):
        idle = self.idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def _conn(self, address: str, head_request: bool, fresh: bool, opener) -> tuple[_Conn, bool]:
        idle = None if fresh else self.idle.get(address)
        while idle:
            conn = idle.pop()
            if conn.idle_handle is not None:
                conn.idle_handle.cancel()
            if conn.transport is not None and not conn.transport.is_closing():
                conn.reset(head_request)
                return conn, True
        loop = asyncio.get_running_loop()
        try:
            if opener is not None:  # the SSH path: a socket handed over, `address` only the pool's key
                connecting = loop.create_connection(lambda: _Conn(self, address, head_request), sock=await opener())
            else:
                host, _, port = address.rpartition(":")
                connecting = loop.create_connection(lambda: _Conn(self, address, head_request), host.strip("[]"),
                                                    int(port))
            _, conn = await asyncio.wait_for(connecting, self.connect_timeout)
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"{address}: {exc or 'timed out'}") from None
        return conn, False

    async def request(self, address: str, method: str, target: str, headers: list[tuple[str, str]], body,
                      length: int | None, read_timeout: float, opener=None) -> Answer:
        """Send one request (its body an async iterator of bytes, or None) and return the answer
        once its head arrived; the body is read from the Answer. A kept connection the replica
        had closed meanwhile is replaced by a new one, when there is no body to send again. `opener`
        (async, returning a connected socket) makes new connections instead of connecting to `address`."""
        for attempt in (0, 1):
            try:
                return await self._request(address, method, target, headers, body, length, read_timeout,
                                           fresh=attempt == 1, opener=opener)
            except _Stale:
                continue
        raise Dropped("the replica closed the connection")

    async def _request(self, address, method, target, headers, body, length, read_timeout, fresh,
                       opener) -> Answer:
        head_request = method == "HEAD"
        conn, reused = await self._conn(address, head_request, fresh, opener)
        host = next((v for k, v in headers if k.lower() == "host"), address)  # the SSH path names the replica's
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
        lines += [f"{k}: {v}" for k, v in headers if k.lower() not in ("host", "content-length")]
        if body is not None:
            lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
        conn.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        conn.body_sent = body is None
        sending = asyncio.ensure_future(_send(conn, body, length is None)) if body is not None else None
        try:
            conn.waiter = asyncio.get_running_loop().create_future()
            if conn.answer is None and conn.error is None:
                await asyncio.wait_for(conn.waiter, read_timeout)
            if conn.error is not None:
                if isinstance(conn.error, Dropped) and reused and body is None:
                    raise _Stale()
                raise conn.error
            return conn.answer
        except BaseException:
            if sending is not None:
                sending.cancel()
            conn.keep = False
            conn.transport.close()
            raise


async def _send(conn: _Conn, body, chunked: bool) -> None:
    try:
        async for piece in body:
            if conn.transport.is_closing():
                return
            conn.transport.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            await conn.writable.wait()
        if chunked and not conn.transport.is_closing():
            conn.transport.write(b"0\r\n\r\n")
        conn.body_sent = True
    except Exception as exc:  # the client's body broke a limit or stalled: the request ends here
        conn._fail(exc)
