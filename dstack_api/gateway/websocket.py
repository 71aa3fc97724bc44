"""The dstack-runner's `/logs_ws` as the dstack CLI reads it, over one forwarded SSH channel.

A minimal RFC 6455 server: the handshake, the job's log in binary frames, a close frame once the
job has ended and its whole log is sent. dstack's client sends nothing but the handshake and its
close, so no frames from it are read; the stream ends as soon as the client's side of the channel
is gone (its EOF or close), not at the job's end.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import time

from django.db import close_old_connections, connection

from runs.services import logs

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_REQUEST = 8192
FRAME = 64 * 1024
POLL = 0.5
# reads after the job ended that found nothing new (5 s): the finish copies the rest meanwhile
QUIET_READS_AT_END = 10


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()


def frame(payload: bytes, opcode: int = 0x2) -> bytes:
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


def read_request(chan) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = chan.recv(1024)
        if not chunk or len(data) + len(chunk) > MAX_REQUEST:
            return None
        data += chunk
    return data


def handshake(request: bytes) -> tuple[bytes, bool]:
    """The answer to a request, and whether it opened the WebSocket."""
    lines = request.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    path = parts[1].split("?", 1)[0] if len(parts) == 3 else ""
    if parts[0] != "GET" or path != "/logs_ws" or not headers.get("sec-websocket-key"):
        return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", False
    return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept_key(headers["sec-websocket-key"]).encode() + b"\r\n\r\n"), True


def stream_log(chan, job) -> None:
    request = read_request(chan)
    if request is None:
        return
    answer, opened = handshake(request)
    chan.sendall(answer)
    if not opened:
        return
    offset, quiet = 0, 0
    while True:
        if chan.closed or chan.eof_received:
            return  # the client went away: nothing reads the rest
        close_old_connections()
        job.refresh_from_db(fields=["status"])
        data = logs.read(job, offset, FRAME)
        if data:
            chan.sendall(frame(data))
            offset += len(data)
            quiet = 0
            continue
        if job.finished:
            quiet += 1
            if quiet >= QUIET_READS_AT_END:
                break
        connection.close()  # not held while idle: an open stream must not keep a database session
        time.sleep(POLL)
    chan.sendall(frame(struct.pack("!H", 1000), opcode=0x8))
