"""A member registering the control plane itself as a fleet host, in production mode.

The attack: an sshd listens on the server's own machine (here on 0.0.0.0 in the test's own network
namespace, where the server runs). A `user` member registers a fleet whose host is an address that
reaches it: 0.0.0.0, `0`, ::ffff:0.0.0.0, or one of the server's interface addresses. With a key
that sshd accepts, the registration would start a runner on the control plane, next to the
worker's MUSTER_ENCRYPTION_KEYS. Real sshd, real worker, through the REST API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import client_for
from tests.ssh_e2e.helpers import fleet_configuration, needs_netns, post_fleet, register, settled
from tests.test_settings_and_compose import PROD

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION_POLICY = """
import django, json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "muster.settings")
django.setup()
from django.conf import settings
print(json.dumps({k: v for k, v in settings.MUSTER.items() if k.startswith("SSH_") and "ADDRESS" in k or k.startswith("SSH_HOSTS")}))
"""


@pytest.fixture(autouse=True)
def _worker(celery_worker):
    return celery_worker


@pytest.fixture
def production_policy(settings, tmp_path):
    """The SSH host policy settings exactly as MUSTER_ENV=production makes them, with no overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_SSH_")}
    env.update({**PROD, "MUSTER_DATA_DIR": str(tmp_path)})
    out = subprocess.run([sys.executable, "-c", PRODUCTION_POLICY], env=env, capture_output=True, text=True,
                         timeout=60, check=True, cwd=ROOT).stdout
    policy = json.loads(out.strip().splitlines()[-1])
    settings.MUSTER = {**settings.MUSTER, **policy, "SSH_TIMEOUT": 5, "SSH_REGISTER_TIMEOUT": 30}
    return policy


@pytest.fixture
def member(make_user):
    """A `user` member of project main: may register fleets, is no admin and no superuser."""
    return client_for(make_user("mallory", role="user"))


@pytest.fixture
def server_sshd(ssh_hosts):
    """An sshd on the server's machine, listening on 0.0.0.0 (every local address), that accepts the key."""
    pool = ssh_hosts(1, mode="loopback")
    host = pool[0]
    host.address = "0.0.0.0"
    host.reconfigure_sshd()
    return pool


def _fleet(pool, hostnames: list[str], name: str = "cp") -> dict:
    conf = fleet_configuration(pool, name=name, placement="any")
    conf["ssh_config"]["hosts"] = [{"hostname": h, "port": pool[0].port} for h in hostnames]
    return conf


def _agents_started(pool) -> list[str]:
    home = pool[0].muster_home / "instances"
    return [str(p) for p in home.glob("*/bin/muster_runner.pyz")] if home.exists() else []


def test_a_member_cannot_register_the_control_plane_as_host_0_0_0_0(member, production_policy, server_sshd):
    fleet = settled(member, "cp") if post_fleet(member, _fleet(server_sshd, ["0.0.0.0"])).status_code == 202 else None
    assert fleet is not None and fleet["status"] == "failed", fleet
    assert "the Muster server itself" in fleet["errors"][0]["msg"]
    assert fleet["instances"][0]["registration"].startswith("failed: ")
    assert _agents_started(server_sshd) == [], "no runner was started on the control plane"


def test_the_address_connected_to_is_checked_not_only_the_one_resolved(member, settings, server_sshd):
    # A deny list naming only loopback (the old production default, or an operator's own list) and
    # no own-address rule: 0.0.0.0 is not in 127.0.0.0/8, but the kernel connects it to 127.0.0.1,
    # which the check of the connected socket's peer sees.
    settings.MUSTER = {**settings.MUSTER, "SSH_HOSTS_DENY": ["127.0.0.0/8"], "SSH_DENY_OWN_ADDRESSES": False,
                       "SSH_TIMEOUT": 5, "SSH_REGISTER_TIMEOUT": 30}
    assert post_fleet(member, _fleet(server_sshd, ["0.0.0.0"])).status_code == 202
    fleet = settled(member, "cp")
    assert fleet["status"] == "failed", fleet
    assert "network the operator denies" in fleet["errors"][0]["msg"]
    log = Path(server_sshd[0]._log).read_text().split("Server listening")[-1]
    assert "Accepted publickey" not in log and "Connection from" not in log, "closed before the SSH handshake"
    assert _agents_started(server_sshd) == []


def test_the_unspecified_addresses_do_not_reach_the_server_itself(member, production_policy, server_sshd):
    spellings = ["0.0.0.0", "0", "0x0", "::ffff:0.0.0.0", "::", "0.1.2.3"]
    resp = post_fleet(member, _fleet(server_sshd, spellings))
    assert resp.status_code in (202, 400), resp.content
    fleet = settled(member, "cp") if resp.status_code == 202 else {"status": "failed", **resp.json()}
    assert fleet["status"] == "failed", fleet
    by_host = {e["loc"][2]: e["msg"] for e in fleet["errors"]}
    for i, hostname in enumerate(spellings):
        assert "not an address this server connects to" in by_host.get(i, ""), (hostname, fleet["errors"])
        assert "the Muster server itself" in by_host[i], (hostname, by_host[i])
    assert _agents_started(server_sshd) == [], "no runner was started on the control plane"


def test_an_address_of_the_servers_own_interfaces_is_refused(member, production_policy, server_sshd, ssh_hosts):
    # The bridge address of a netns pool is an address of the server's own interface: the sshd on
    # 0.0.0.0 answers there. So does the integer spelling of it.
    bridge = ssh_hosts(1, mode="netns").bridge_address
    as_integer = str(int.from_bytes(bytes(int(b) for b in bridge.split(".")), "big"))
    spellings = [bridge, as_integer, f"::ffff:{bridge}"]
    resp = post_fleet(member, _fleet(server_sshd, spellings))
    fleet = settled(member, "cp") if resp.status_code == 202 else {"status": "failed", **resp.json()}
    assert fleet["status"] == "failed", fleet
    by_host = {e["loc"][2]: e["msg"] for e in fleet["errors"]}
    for i, hostname in enumerate(spellings):
        assert "the Muster server itself" in by_host.get(i, ""), (hostname, fleet["errors"])
    assert _agents_started(server_sshd) == []


def test_ordinary_private_hosts_still_register_in_production_mode(member, production_policy, ssh_hosts):
    pool = ssh_hosts(2, mode="netns")
    assert register(member, fleet_configuration(pool, name="gpu"))["status"] == "active"


def test_an_own_address_the_operator_allows_registers(member, production_policy, server_sshd, ssh_hosts, settings):
    bridge = ssh_hosts(1, mode="netns").bridge_address
    # the host (this machine) reports its first global address as its internal IP, which the dstack
    # gateway forwards jobs' ports to: the operator allows that one too, or the host is refused
    first = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True,
                           timeout=30, check=True).stdout.split()[3].split("/")[0]
    settings.MUSTER = {**settings.MUSTER, "SSH_OWN_ADDRESSES_ALLOW": [f"{bridge}/32"]}
    if first != bridge:
        refused = register(member, _fleet(server_sshd, [bridge]))
        assert refused["status"] == "failed", refused
        assert f"reports its internal IP as {first}" in refused["errors"][0]["msg"], refused["errors"]
        assert "the Muster server itself" in refused["errors"][0]["msg"], refused["errors"]
    settings.MUSTER = {**settings.MUSTER, "SSH_OWN_ADDRESSES_ALLOW": [f"{bridge}/32", f"{first}/32"]}
    assert register(member, _fleet(server_sshd, [bridge], name="cp2"))["status"] == "active"


def test_a_name_that_resolves_elsewhere_at_connect_time_reaches_only_the_checked_address(
        member, production_policy, server_sshd, ssh_hosts, monkeypatch):
    # A DNS name whose answers change (rebinding): first a fleet host's address, then loopback, where
    # the server's own sshd listens. No resolver of this machine may be changed by a test, so the
    # name is answered in-process; everything else (sockets, sshd, the worker) is real.
    import socket

    from backends.ssh.errors import HostNotAllowed
    from backends.ssh.runner_host import SSHRunnerHost
    from instances.models import Instance

    pool = ssh_hosts(1, mode="netns")
    with open(pool.authorized_keys, "a") as keys:  # the key the server's sshd accepts logs in here too
        keys.write(server_sshd.public_key + " server-pool\n")
    real, answers = socket.getaddrinfo, []

    def rebinding(host, port, *args, **kwargs):
        if host != "rebind.test":
            return real(host, port, *args, **kwargs)
        answers.append(pool[0].address if len(answers) % 2 == 0 else "127.0.0.1")
        return real(answers[-1], port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    conf = _fleet(server_sshd, ["rebind.test"], name="rebind")
    conf["ssh_config"]["hosts"][0]["port"] = 22
    fleet = settled(member, "rebind") if post_fleet(member, conf).status_code == 202 else None
    assert fleet is not None and fleet["status"] == "active", fleet
    inst = Instance.objects.get(name="rebind-0")
    assert inst.host_key == pool[0].host_key, "the checked address is the one connected to"
    assert _agents_started(server_sshd) == []

    runner = SSHRunnerHost(inst.ssh_target(), timeout=5)
    try:
        with pytest.raises(HostNotAllowed, match="the Muster server itself"):
            runner.status()  # the next answer is loopback: refused, not connected
    finally:
        runner.close()
