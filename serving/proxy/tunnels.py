"""The SSH path: a replica on an SSH host the endpoint cannot reach directly, reached through the
host's SSH connection, as `ssh -L` (and `muster attach`) forward a port.

A replica on an SSH fleet's host is tried directly first (its instance's address and the
service's port). When that connection fails (refused, unreachable, timed out), the endpoint logs
in to the host as the engine does (the fleet's key, the recorded host key, the SSH address
policy: backends/ssh/connection.py) and opens a `direct-tcpip` channel to the replica's port at the
host's own address for it (DSTACK_NODE_IP, what the replica binds) or, where that is refused, at
the host's loopback. The channel is offered to the HTTP client as a local port (127.0.0.1, one per
host and destination), so forwarding, streaming and retries are the same code on both paths.
A host that needed the tunnel is tried through it first for PREFER seconds, then directly again.

Cost: one SSH connection per host (kept while it lives), and on this path one thread per open
connection (paramiko's channels block); the direct path has neither.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("muster.endpoint")
PREFER = 60.0
OPEN_TIMEOUT = 10.0


class Tunnel:
    """A local listening port whose every connection is one channel to `dest` through `client`."""

    def __init__(self, client, dests: tuple[tuple[str, int], ...], pumps: ThreadPoolExecutor):
        self.client, self.dests, self.pumps = client, dests, pumps
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    @property
    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active() and self.server is not None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        self.client.close()

    def _open_channel(self):
        transport = self.client.get_transport()
        last: Exception | None = None
        for dest in self.dests:
            try:
                return transport.open_channel("direct-tcpip", dest, ("127.0.0.1", 0), timeout=OPEN_TIMEOUT)
            except Exception as exc:  # paramiko's ChannelException: refused at that address
                last = exc
        raise ConnectionRefusedError(f"no replica at {self.dests} through SSH: {last}")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            channel = await loop.run_in_executor(self.pumps, self._open_channel)
        except Exception:
            writer.close()  # the HTTP client sees the connection closed: a refusal, as on the direct path
            return

        def back() -> None:  # the replica's bytes to the client, waiting for the client to take them
            try:
                while data := channel.recv(1 << 16):
                    asyncio.run_coroutine_threadsafe(_write(writer, data), loop).result()
            except Exception:  # the client or the channel went away
                pass
            finally:
                loop.call_soon_threadsafe(writer.close)

        threading.Thread(target=back, name="endpoint-ssh-back", daemon=True).start()
        try:
            while data := await reader.read(1 << 16):
                await loop.run_in_executor(self.pumps, channel.sendall, data)
        except Exception:
            pass
        finally:
            channel.close()


async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


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

    async def _local_address(self, replica) -> str | None:
        key = (replica.instance_id, replica.port)
        lock = self._opening.setdefault(key, asyncio.Lock())
        async with lock:
            tunnel = self._open.get(key)
            if tunnel is not None and tunnel.alive:
                return f"127.0.0.1:{tunnel.port}"
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
            dests = ((replica.inner or replica.host, replica.port), ("127.0.0.1", replica.port))
            tunnel = Tunnel(client, dests, self._pumps)
            await tunnel.start()
            self._open[key] = tunnel
            return f"127.0.0.1:{tunnel.port}"

    async def local_address(self, replica) -> str | None:
        """The local port that reaches `replica` through its host's SSH connection (made on first
        use, made again when the connection died), or None when its host cannot be logged in to."""
        address = await self._local_address(replica)
        if address is not None:
            self._prefer[replica.instance_id] = time.monotonic() + PREFER
        return address

    def close(self) -> None:
        for tunnel in self._open.values():
            tunnel.close()
        self._pumps.shutdown(wait=False)
