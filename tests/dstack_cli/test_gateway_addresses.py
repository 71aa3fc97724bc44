# ruff: noqa: F811 - pytest injects the fixtures imported from test_gateway by parameter name
"""The SSH gateway is a TCP client of the control plane: where it connects, and for whom.

The attack: a `user` member registers a host that says its address is 127.0.0.1 (or the cloud's
metadata address), runs a job with a port, and forwards that port through the gateway; the gateway
would connect, on the server, to the server's own loopback. Real sshd hosts in namespaces (the
host's own `ip addr` reports the address), a real worker, the real OpenSSH client, a real listener
on the control plane's 127.0.0.1 that only the server's own processes should reach.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from dstack_api.services import keys
from instances.models import Fleet, FleetStatus
from projects.models import Membership, Project
from runs.models import Run
from tests.dstack_cli.test_gateway import (  # noqa: F401 - fixtures
    _free_port,
    _status,
    _try,
    _write,
    base,
    dstack,
    gateway,
)
from tests.ssh_e2e.helpers import (  # noqa: F401 - an autouse fixture
    fleet_configuration,
    needs_netns,
    netns_pool,
    registered_fleet,
    short_ssh_timeouts,
)
from tests.ssh_e2e.test_own_addresses import production_policy  # noqa: F401 - a fixture
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.dstack_cli, pytest.mark.django_db(transaction=True)]

pool = netns_pool(2)  # host 0 is made to report a chosen address; host 1 keeps its own
SECRET = b"only-the-control-plane-may-read-this"


@pytest.fixture
def alice(make_user):
    """The attacker: a `user` member of main, no admin, no superuser."""
    return make_user("alice", role="user")


def _report(host, address: str):
    """The host's first global IPv4 address becomes `address`: what `ip addr` (the probe) reports."""
    host.netns_exec(["ip", "addr", "add", f"{address}/32", "dev", "lo", "scope", "global"], check=True)


def _unreport(host, address: str) -> None:
    host.netns_exec(["ip", "addr", "del", f"{address}/32", "dev", "lo"])


@pytest.fixture
def reports_loopback(pool):
    _report(pool[0], "127.0.0.1")
    yield pool[0]
    _unreport(pool[0], "127.0.0.1")


@pytest.mark.parametrize(("address", "why"), [("127.0.0.1", "it is an address of the Muster server itself"),
                                              ("169.254.169.254", "the operator denies (MUSTER_SSH_HOSTS_DENY)")])
def test_a_host_reporting_a_denied_internal_ip_fails_registration_saying_why(
        pool, alice, production_policy, address, why):
    _report(pool[0], address)
    try:
        fleet = registered_fleet(Project.objects.get(name="main"),
                                 fleet_configuration(pool, name="liar", hosts=[pool[0]], placement="any"), user=alice)
    finally:
        _unreport(pool[0], address)
    assert fleet.status == FleetStatus.FAILED, (fleet.status, fleet.errors)
    [error] = fleet.errors
    assert error["loc"] == ["ssh_config", "hosts", 0]
    assert f"reports its internal IP as {address}" in error["msg"], error
    assert why in error["msg"], error
    assert not fleet.instances.exclude(status="terminated").exists()


def _listener(port: int) -> socket.socket:
    """A service on the control plane's loopback: it answers whoever connects with SECRET."""
    server = socket.create_server(("127.0.0.1", port))

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(SECRET)

    threading.Thread(target=serve, daemon=True).start()
    return server


def _forward(base: Path, gateway: int, key: Path, user: str, target: str):
    """`ssh -N -L` through the gateway with `key`; the local port, once it listens, and the process."""
    import subprocess

    local = _free_port()
    tunnel = subprocess.Popen(
        ["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={base / 'dstack-home' / '.ssh' / 'known_hosts'}",
         "-o", "StrictHostKeyChecking=yes", "-N", "-L", f"{local}:{target}", "-p", str(gateway), f"{user}@127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: _try(lambda: socket.create_connection(("127.0.0.1", local), timeout=1).close() or True),
               timeout=20, what="the tunnel to listen")
    return local, tunnel


def _read(port: int, send: bytes = b"") -> bytes:
    """Everything that comes back on a connection to the forwarded port (b"" when the gateway refused)."""
    data = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            if send:
                s.sendall(send)
            while chunk := s.recv(65536):
                data += chunk
                if SECRET in data or b"</html>" in data.lower() or len(data) > 1 << 20:
                    break
    except OSError:
        pass
    return data


def _key_file(base: Path, user) -> Path:
    path = base / f"id_{user.username}"
    path.write_text(keys.keypair_of(user).private_key)
    path.chmod(0o600)
    return path


def _fleet_of(dstack, pool, hosts, base, name: str) -> None:
    (base / "id_fleet").write_text(pool.private_key)
    (base / "id_fleet").chmod(0o600)
    conf = _write(base / f"{name}.yml", {
        "type": "fleet", "name": name, "placement": "any",
        "ssh_config": {"user": pool.user, "identity_file": str(base / "id_fleet"),
                       "hosts": [{"hostname": h.address, "port": h.port} for h in hosts]}})
    applied = dstack("apply", "-f", conf, "-y")
    assert applied.returncode == 0, (applied.stdout, applied.stderr)
    fleet = wait_until(lambda: Fleet.objects.filter(name=name, status=FleetStatus.ACTIVE).first(), timeout=120,
                       what=f"fleet {name} active")
    assert fleet is not None


def test_the_gateway_does_not_forward_a_port_to_an_address_the_host_policy_denies(
        dstack, reports_loopback, pool, base, alice, gateway, settings, production_policy):
    # registered while the operator allowed loopback (the development default), as a host whose row
    # predates the registration check would be; the policy is tightened later, as in production
    settings.MUSTER = {**settings.MUSTER, "SSH_HOSTS_DENY": [], "SSH_DENY_OWN_ADDRESSES": False}
    _fleet_of(dstack, pool, [pool[0]], base, "lo")
    port = _free_port()
    listener = _listener(port)
    try:
        task = _write(base / "lo-task.yml", {"type": "task", "name": "lo-web", "ports": [port],
                                             "commands": ["sleep 300"]})
        assert dstack("apply", "-f", task, "-y", "-d").returncode == 0
        _status("lo-web", ("running",))
        job = Run.objects.get(name="lo-web").jobs.get()
        assert job.instance.internal_ip == "127.0.0.1"
        local, tunnel = _forward(base, gateway, _key_file(base, alice), f"{job.uuid.hex}_root", f"localhost:{port}")
        try:
            # the development defaults register such a host, but a forward is the control plane's own
            # connection: it never goes to the server's own loopback unless the operator names it
            assert _read(local) == b""
            # the way through is real: with loopback allowed, the forward reaches the server's own listener
            settings.MUSTER = {**settings.MUSTER, "SSH_OWN_ADDRESSES_ALLOW": ["127.0.0.1/32"]}
            assert SECRET in _read(local)
            settings.MUSTER = {**settings.MUSTER, **production_policy}
            assert _read(local) == b""
            assert _read(local) == b""
        finally:
            tunnel.kill()
            tunnel.wait(timeout=10)
        assert "prohibited" in tunnel.stderr.read()
    finally:
        listener.close()
        dstack("stop", "lo-web", "-y")


def test_a_read_only_member_follows_the_log_but_gets_no_tunnel_to_the_jobs_port(
        dstack, pool, base, alice, gateway, make_user, settings):
    bob = make_user("bob", role="read-only")
    _fleet_of(dstack, pool, [pool[1]], base, "web")
    port = _free_port()
    task = _write(base / "ro.yml", {
        "type": "task", "name": "ro-web", "ports": [port],
        "commands": ["echo ro-log-line", "mkdir -p /tmp/ro-$$ && echo served-to-writers > /tmp/ro-$$/index.html",
                     f"timeout 200 python3 -m http.server {port} --bind 0.0.0.0 --directory /tmp/ro-$$ "
                     "--protocol HTTP/1.1"]})  # keep-alive: a connection through the forward stays open
    assert dstack("apply", "-f", task, "-y", "-d").returncode == 0
    _status("ro-web", ("running",))
    user = f"{Run.objects.get(name='ro-web').jobs.get().uuid.hex}_root"
    get = b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n"
    tunnels = []
    try:
        # alice (user) reaches the job's port: the path works
        local, tunnel = _forward(base, gateway, _key_file(base, alice), user, f"localhost:{port}")
        tunnels.append(tunnel)
        assert "served-to-writers" in wait_until(lambda: _read(local, get).decode(errors="replace"), timeout=60,
                                                 what="alice's answer through the tunnel")
        alice_local = local
        # bob (read-only) follows the log, as `muster logs` lets him
        bob_key = _key_file(base, bob)
        local, tunnel = _forward(base, gateway, bob_key, user, "localhost:10999")
        tunnels.append(tunnel)
        ws = (b"GET /logs_ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        log_seen = wait_until(lambda: (b := _read_until(local, ws, b"ro-log-line")) and b, timeout=30,
                              what="bob's log through -L 10999")
        assert log_seen.startswith(b"HTTP/1.1 101")
        # but no tunnel to the job's port, as `muster attach` refuses him
        local, tunnel = _forward(base, gateway, bob_key, user, f"localhost:{port}")
        tunnels.append(tunnel)
        assert _read(local, get) == b""
        # alice made read-only: her open forward to the port is closed at the next check
        settings.MUSTER = {**settings.MUSTER, "DSTACK_SSH_RECHECK": 1}
        with socket.create_connection(("127.0.0.1", alice_local), timeout=10) as held:
            held.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            answer = b""
            while b"served-to-writers" not in answer:  # the forward is open end to end, and stays open
                answer += held.recv(65536) or b"(closed)"
                assert b"(closed)" not in answer, answer
            held.settimeout(1)
            Membership.objects.filter(user=alice).update(role="read-only")
            wait_until(lambda: _closed(held), timeout=30, what="alice's open forward closed")
    finally:
        for tunnel in tunnels:
            tunnel.kill()
            tunnel.wait(timeout=10)
        dstack("stop", "ro-web", "-y")
    assert "prohibited" in tunnels[-1].stderr.read()


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def _read_until(port: int, send: bytes, wanted: bytes) -> bytes:
    data = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(send)
            while wanted not in data and (chunk := s.recv(65536)):
                data += chunk
    except OSError:
        pass
    return data if wanted in data else b""


def test_a_local_instance_keeps_its_port_forward_under_the_production_policy(
        dstack, base, alice, gateway, superuser_api, settings, production_policy):
    # the local backend is the server's own machine by design (docs/security.md): its 127.0.0.x
    # addresses are Muster's, not a host's word, and stay reachable through the gateway although the
    # production policy denies loopback and the server's own addresses to SSH hosts
    assert superuser_api.post("/api/projects/main/fleets/", {"configuration": "type: fleet\nname: here\n"
                               "backends: [local]\nnodes: 1\n"}, format="json").status_code == 201
    port = _free_port()
    task = _write(base / "here.yml", {
        "type": "task", "name": "here-web", "ports": [port], "fleets": ["here"],
        "commands": ["mkdir -p /tmp/here-$$ && echo served-from-a-local-instance > /tmp/here-$$/index.html",
                     f"timeout 200 python3 -m http.server {port} --bind 0.0.0.0 --directory /tmp/here-$$"]})
    assert dstack("apply", "-f", task, "-y", "-d").returncode == 0
    _status("here-web", ("running",))
    job = Run.objects.get(name="here-web").jobs.get()
    assert job.instance.backend == "local" and job.instance.internal_ip.startswith("127.")
    local, tunnel = _forward(base, gateway, _key_file(base, alice), f"{job.uuid.hex}_root", f"localhost:{port}")
    try:
        answer = wait_until(lambda: _read(local, b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n").decode(errors="replace"),
                            timeout=60, what="the local job's answer through the tunnel")
        assert "served-from-a-local-instance" in answer
    finally:
        tunnel.kill()
        tunnel.wait(timeout=10)
        dstack("stop", "here-web", "-y")
