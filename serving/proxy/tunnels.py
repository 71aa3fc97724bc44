"""The SSH path: a replica on an SSH host the endpoint cannot reach directly, reached through the
host's SSH connection, as `ssh -L` (and `muster attach`) forward a port, but with no port open.

A replica on an SSH fleet's host is tried directly first (its instance's address and the
service's port). When that connection fails (refused, unreachable, timed out), the endpoint logs
in to the host as the engine does (the fleet's key, the recorded host key, the SSH address
policy: backends/ssh/connection.py) and opens a `direct-tcpip` channel to the replica's port at the
host's own address for it (DSTACK_NODE_IP, what the replica binds). Each connection to the replica
is one channel and one socketpair in this process: the HTTP client (upstream.py, or aiohttp for a
WebSocket) gets one end, two threads pump the other end to and from the channel. Nothing listens:
a local port would let any process in the endpoint's network namespace reach the replica past
`auth: true`. A host that needed the tunnel is tried through it first for PREFER seconds, then
directly again. A tunnel whose replica left every routing table entry is closed (prune).

Cost: one SSH connection per host and port (kept while its replica is routed), and on this path
two threads per open connection (paramiko's channels block); the direct path has neither.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
from aiohttp.connector import BaseConnector

log = logging.getLogger("muster.endpoint")
PREFER = 60.0
OPEN_TIMEOUT = 10.0


class Tunnel:
    """Connections to `dest` through `client`, each a channel handed over as one end of a socketpair."""

    def __init__(self, client, dest: tuple[str, int], pumps: ThreadPoolExecutor):
        self.client, self.dest, self.pumps = client, dest, pumps
        self.closed = False
        self._session: aiohttp.ClientSession | None = None

    @property
    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active() and not self.closed

    def session(self) -> aiohttp.ClientSession:
        """An aiohttp session whose every connection is one through this tunnel (WebSockets)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=_TunnelConnector(self), auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"))
        return self._session

    def close(self) -> None:
        self.closed = True
        if self._session is not None:
            try:
                asyncio.get_running_loop().create_task(self._session.close())
            except RuntimeError:  # no loop left (shutting down): its connections die with the client's
                pass
            self._session = None
        self.client.close()  # every channel ends: the pumps close their sockets, the pool forgets them

    def _open_channel(self):
        # only the job's own node address: a fallback to the host's 127.0.0.1 would let a service's
        # `port` reach whatever listens on its host's loopback (the host's own daemons), not a replica
        try:
            return self.client.get_transport().open_channel("direct-tcpip", self.dest, ("127.0.0.1", 0),
                                                            timeout=OPEN_TIMEOUT)
        except Exception as exc:  # paramiko's ChannelException: refused at that address
            raise ConnectionRefusedError(f"no replica at {self.dest} through SSH: {exc}") from None

    async def open_socket(self) -> socket.socket:
        """A connected, non-blocking socket whose other end is a new channel to the replica."""
        channel = await asyncio.get_running_loop().run_in_executor(self.pumps, self._open_channel)
        ours, theirs = socket.socketpair()
        out = threading.Thread(target=_pump_out, args=(theirs, channel), name="endpoint-ssh-out", daemon=True)
        out.start()
        threading.Thread(target=_pump_back, args=(theirs, channel, out), name="endpoint-ssh-back",
                         daemon=True).start()
        ours.setblocking(False)
        return ours


def _pump_out(sock: socket.socket, channel) -> None:
    """The client's bytes to the replica; the client closing ends the channel."""
    try:
        while data := sock.recv(1 << 16):
            channel.sendall(data)
    except OSError:
        pass
    finally:
        channel.close()


def _pump_back(sock: socket.socket, channel, out: threading.Thread) -> None:
    """The replica's bytes to the client; the replica (or the SSH connection) closing ends the socket."""
    try:
        while data := channel.recv(1 << 16):
            sock.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes _pump_out's recv
        except OSError:
            pass
        out.join()
        sock.close()


class _TunnelConnector(BaseConnector):
    def __init__(self, tunnel: Tunnel):
        super().__init__(limit=0, keepalive_timeout=30.0)
        self._tunnel = tunnel

    async def _create_connection(self, req, traces, timeout):
        try:
            _, proto = await self._loop.create_connection(self._factory, sock=await self._tunnel.open_socket())
        except OSError as exc:
            raise aiohttp.ClientConnectorError(req.connection_key, exc) from exc
        return proto


def _connect(target):
    from backends.ssh.connection import connect

    return connect(target, timeout=OPEN_TIMEOUT)


class Tunnels:
    def __init__(self, executor: ThreadPoolExecutor, read_target):
        self._executor, self._read_target = executor, read_target
        self._pumps = ThreadPoolExecutor(max_workers=32, thread_name_prefix="endpoint-ssh")
        self._open: dict[tuple[int, int], Tunnel] = {}
        self._opening: dict[tuple[int, int], asyncio.Lock] = {}
        self._prefer: dict[int, float] = {}
        self._no_ssh: dict[int, float] = {}

    def prefers(self, replica) -> bool:
        return self._prefer.get(replica.instance_id, 0.0) > time.monotonic()

    async def _tunnel(self, replica) -> Tunnel | None:
        key = (replica.instance_id, replica.port)
        lock = self._opening.setdefault(key, asyncio.Lock())
        async with lock:
            tunnel = self._open.get(key)
            if tunnel is not None and tunnel.alive:
                return tunnel
            if tunnel is not None:
                tunnel.close()
            if self._no_ssh.get(replica.instance_id, 0.0) > time.monotonic():
                return None  # its host refused a log-in lately: no request waits for another try
            loop = asyncio.get_running_loop()
            try:
                target = await loop.run_in_executor(self._executor, self._read_target, replica.instance_id)
                if target is None:
                    return None
                client = await loop.run_in_executor(self._pumps, _connect, target)
            except Exception as exc:
                self._no_ssh[replica.instance_id] = time.monotonic() + PREFER
                log.warning("no SSH path to replica %s (instance %s): %s", replica.job_id, replica.instance_id, exc)
                return None
            tunnel = self._open[key] = Tunnel(client, (replica.inner or replica.host, replica.port), self._pumps)
            return tunnel

    async def tunnel(self, replica) -> Tunnel | None:
        """The tunnel that reaches `replica` through its host's SSH connection (made on first use,
        made again when the connection died), or None when its host cannot be logged in to."""
        tunnel = await self._tunnel(replica)
        if tunnel is not None:
            self._prefer[replica.instance_id] = time.monotonic() + PREFER
        return tunnel

    def prune(self, routed: set[tuple[int, int]]) -> None:
        """Close the tunnels to replicas no longer in the routing table ((instance id, port) pairs)."""
        for key in [k for k in self._open if k not in routed]:
            self._open.pop(key).close()
            lock = self._opening.get(key)
            if lock is not None and not lock.locked():
                del self._opening[key]

    def close(self) -> None:
        for tunnel in self._open.values():
            tunnel.close()
        self._open.clear()
        self._pumps.shutdown(wait=False)
