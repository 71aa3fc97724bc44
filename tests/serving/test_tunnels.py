"""The SSH path's tunnels without an SSH host: a replica that left the routing table closes its
host's connection, and a connection through a tunnel is a socketpair end pumped to a channel."""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor

from serving.proxy.tunnels import Tunnel, Tunnels


class FakeChannel:
    """A channel whose far end is a plain socket the test holds (the replica)."""

    def __init__(self):
        self.near, self.far = socket.socketpair()

    def recv(self, n):
        return self.near.recv(n)

    def sendall(self, data):
        self.near.sendall(data)

    def close(self):
        try:
            self.near.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class FakeClient:
    def __init__(self):
        self.closed, self.channels, self.dests = False, [], []

    def get_transport(self):
        return self

    def is_active(self):
        return not self.closed

    def open_channel(self, kind, dest, origin, timeout):
        self.dests.append(dest)
        self.channels.append(FakeChannel())
        return self.channels[-1]

    def close(self):
        self.closed = True


def test_a_connection_is_pumped_to_its_channel_at_the_jobs_address_only_and_pruning_closes_it():
    pumps = ThreadPoolExecutor(max_workers=2)

    async def scenario():
        client = FakeClient()
        tunnel = Tunnel(client, ("10.0.0.5", 8000), pumps)
        sock = await tunnel.open_socket()
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"ping")
        await writer.drain()
        replica = client.channels[0].far
        assert await asyncio.to_thread(replica.recv, 4) == b"ping"
        replica.sendall(b"pong")
        assert await reader.readexactly(4) == b"pong"
        assert client.dests == [("10.0.0.5", 8000)]  # never the host's 127.0.0.1

        tunnels = Tunnels(pumps, lambda instance_id: None)
        tunnels._open[(7, 8000)] = tunnel
        other = tunnels._open[(8, 8000)] = Tunnel(FakeClient(), ("10.0.0.6", 8000), pumps)
        tunnels.prune({(8, 8000)})
        assert client.closed and not tunnel.alive and (7, 8000) not in tunnels._open
        assert other.alive and (8, 8000) in tunnels._open
        writer.close()

    asyncio.run(scenario())
    pumps.shutdown(wait=False)
