# ruff: noqa: F811 - pytest injects the fixtures imported from test_gateway by parameter name
"""What one client may hold of the SSH gateway: logins, connections, channels, and for how long.

Real OpenSSH clients (and paramiko's client where a client must stop after the key exchange, which
OpenSSH cannot be told to do), against the gateway serving a live Muster with a real worker and a
real sshd host in a namespace.
"""

from __future__ import annotations

import socket
import subprocess
import threading

import paramiko
import pytest

from dstack_api.gateway import server
from projects.models import Membership
from runs.models import Run
from tests.dstack_cli.test_gateway import (  # noqa: F401 - fixtures
    _fleet,
    _free_port,
    _status,
    _try,
    _write,
    alice,
    base,
    dstack,
    gateway,
)
from tests.ssh_e2e.helpers import needs_netns, netns_pool, short_ssh_timeouts  # noqa: F401 - an autouse fixture
from tests.waiting import patient, wait_until

pytestmark = [*needs_netns, pytest.mark.dstack_cli, pytest.mark.django_db(transaction=True)]

pool = netns_pool(1)
WS = (b"GET /logs_ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


def _ssh_args(base, gateway, user):
    key = base / "dstack-home" / "id_user"
    return ["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={base / 'dstack-home' / '.ssh' / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10", "-p", str(gateway), f"{user}@127.0.0.1"]


def _tunnel(base, gateway, user):
    """`ssh -N -L <local>:localhost:10999` (the log endpoint): the local port once it listens, and ssh."""
    local = _free_port()
    proc = subprocess.Popen([*_ssh_args(base, gateway, user), "-N", "-L", f"{local}:localhost:10999"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: proc.poll() is not None or _try(
        lambda: socket.create_connection(("127.0.0.1", local), timeout=1).close() or True),
        timeout=30, what="the tunnel to listen")
    return local, proc


def _live(tunnel):
    """The tunnel if its login holds, else None (its ssh gone)."""
    if tunnel[1].poll() is None:
        return tunnel
    tunnel[1].stderr.read()
    return None


def _stop(proc) -> str:
    proc.kill()
    proc.wait(timeout=10)
    return proc.stderr.read()


def _log_stream(local: int):
    """A WebSocket log stream through the tunnel: the socket and the first bytes, b"" if refused."""
    s = socket.create_connection(("127.0.0.1", local), timeout=patient(20))
    s.sendall(WS)
    try:
        first = s.recv(65536)
    except OSError:
        first = b""
    return s, first


def _channel_threads() -> list[threading.Thread]:
    # the gateway runs in this process (the fixture): its threads serving one channel each
    return [t for t in threading.enumerate() if getattr(t, "_target", None) is server._serve_channel]


@pytest.fixture
def ticking(dstack, pool, base, alice):
    """A running job that logs one line and then nothing for minutes (a log stream with nothing to
    send never writes to its channel, so only watching the channel tells that its client left), and
    the gateway login naming it."""
    _fleet(dstack, pool, base)
    task = _write(base / "tick.yml", {"type": "task", "name": "tick", "commands": ["echo log-start", "sleep 300"]})
    assert dstack("apply", "-f", task, "-y", "-d").returncode == 0
    _status("tick", ("running",))
    key = base / "dstack-home" / "id_user"
    from dstack_api.services import keys

    key.write_text(keys.keypair_of(alice).private_key)
    key.chmod(0o600)
    yield f"{Run.objects.get(name='tick').jobs.get().uuid.hex}_root"
    dstack("stop", "tick", "-y")


def test_clients_that_never_log_in_hold_one_addresss_share_and_are_dropped_at_the_deadline(gateway, settings):
    settings.MUSTER = {**settings.MUSTER, "DSTACK_SSH_AUTH_TIMEOUT": 600}
    idle = []
    try:
        # as many clients as the gateway has connections, from one address: each finishes the key
        # exchange and never logs in
        for _ in range(64):
            sock = socket.create_connection(("127.0.0.1", gateway), timeout=patient(10), source_address=("127.0.0.2", 0))
            transport = paramiko.Transport(sock)
            try:
                transport.start_client(timeout=patient(10))
            except (paramiko.SSHException, EOFError, OSError):
                transport.close()  # refused: that address holds its share
                continue
            idle.append(transport)
        assert 0 < len(idle) < 64
        # someone else, from another address, still reaches the login (and is refused for the key)
        other = subprocess.run(
            ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-p", str(gateway),
             f"{'0' * 32}_root@127.0.0.1", "-N"],
            capture_output=True, text=True, timeout=patient(30), stdin=subprocess.DEVNULL)
        assert "Permission denied" in other.stderr, other.stderr
        # and those that never log in are dropped once the deadline passes
        assert all(t.is_active() for t in idle)
        settings.MUSTER = {**settings.MUSTER, "DSTACK_SSH_AUTH_TIMEOUT": 1}
        wait_until(lambda: not any(t.is_active() for t in idle), timeout=30, what="the idle clients dropped")
    finally:
        for transport in idle:
            transport.close()


def test_one_user_holds_at_most_max_per_user_logins(ticking, base, gateway, settings):
    settings.MUSTER = {**settings.MUSTER, "DSTACK_SSH_MAX_PER_USER": 2}
    first, second = _tunnel(base, gateway, ticking), _tunnel(base, gateway, ticking)
    streams = [_log_stream(first[0]), _log_stream(second[0])]  # both logins in use
    try:
        assert all(head.startswith(b"HTTP/1.1 101") for _, head in streams)
        third = subprocess.run([*_ssh_args(base, gateway, ticking), "-N"], capture_output=True, text=True,
                               timeout=patient(30), stdin=subprocess.DEVNULL)
        assert third.returncode != 0 and "Permission denied" in third.stderr, third.stderr
        _stop(first[1])
        # a login given back is free again (once the gateway has seen it go)
        local, again = wait_until(lambda: _live(_tunnel(base, gateway, ticking)), timeout=30, what="a login again")
        try:
            stream, head = _log_stream(local)
            stream.close()
            assert head.startswith(b"HTTP/1.1 101"), head
        finally:
            _stop(again)
    finally:
        for s, _ in streams:
            s.close()
        for _, proc in (first, second):
            if proc.poll() is None:
                _stop(proc)


def test_log_channels_are_capped_per_connection_and_end_when_their_client_goes(ticking, base, gateway, settings):
    settings.MUSTER = {**settings.MUSTER, "DSTACK_SSH_MAX_CHANNELS": 3}
    local, tunnel = _tunnel(base, gateway, ticking)
    streams = []
    try:
        for _ in range(8):
            streams.append(_log_stream(local))
        opened = [head for _, head in streams if head.startswith(b"HTTP/1.1 101")]
        assert len(opened) == 3, [head[:20] for _, head in streams]
        assert len(_channel_threads()) == 3
        # the client closes its streams: their channels end though the job goes on logging
        for s, _ in streams:
            s.close()
        wait_until(lambda: not _channel_threads(), timeout=30, what="the log channels to end with their client")
        streams = [_log_stream(local) for _ in range(2)]
        assert all(head.startswith(b"HTTP/1.1 101") for _, head in streams)
        assert len(_channel_threads()) == 2
        # the client goes away altogether
        _stop(tunnel)
        wait_until(lambda: not _channel_threads(), timeout=30, what="the log channels to end with the connection")
    finally:
        for s, _ in streams:
            s.close()
        if tunnel.poll() is None:
            _stop(tunnel)


def test_an_open_log_stream_and_login_end_when_the_member_is_removed(ticking, base, gateway, alice, settings):
    settings.MUSTER = {**settings.MUSTER, "DSTACK_SSH_RECHECK": 1}
    local, tunnel = _tunnel(base, gateway, ticking)
    stream, head = _log_stream(local)
    try:
        assert head.startswith(b"HTTP/1.1 101"), head
        seen = [head]
        wait_until(lambda: b"log-start" in b"".join(seen) or seen.append(stream.recv(65536)), timeout=30,
                   what="the log's first line")
        Membership.objects.filter(user=alice).delete()
        # the open login is closed by the gateway, and with it the stream
        wait_until(lambda: tunnel.poll() is not None, timeout=30, what="the gateway to close the login")

        def ended():
            try:
                return stream.recv(65536) == b""
            except OSError:
                return True

        wait_until(ended, timeout=30, what="the log stream to end")
    finally:
        stream.close()
        if tunnel.poll() is None:
            _stop(tunnel)
