"""Registering SSH fleets through the API against real sshd hosts in network namespaces."""

from __future__ import annotations

import ipaddress
import subprocess

import pytest

from backends.ssh.errors import HostKeyMismatch
from backends.ssh.runner_host import SSHRunnerHost
from instances.models import Fleet, Instance, InstanceGroup
from muster import crypto
from tests.ssh_e2e.helpers import (
    L40S,
    fleet_configuration,
    needs_netns,
    post_fleet,
    refused,
    register,
    runner_processes,
    settled,
)
from tests.sshhosts import SSHHostPool, _ed25519_keypair
from tests.waiting import wait_until

# Registration runs in a Celery task: a real worker, and a database the worker's thread can see.
pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _worker(celery_worker):
    return celery_worker


@pytest.fixture(scope="module")
def pool():
    # host0 is a CPU host; host1 and host2 each report 2 x L40S through their nvidia-smi.
    with SSHHostPool(3, gpus=[[], [L40S, L40S], [L40S, L40S]], mode="netns") as pool:
        yield pool


@pytest.fixture(scope="module")
def far_pool():
    """One more host, on a subnet of its own."""
    with SSHHostPool(1, mode="netns") as pool:
        yield pool


@pytest.fixture(autouse=True)
def short_ssh_timeouts(settings):
    # An address nobody answers at should cost seconds, not the production 10 s per attempt.
    settings.MUSTER = {**settings.MUSTER, "SSH_TIMEOUT": 3, "SSH_REGISTER_TIMEOUT": 30}


def test_three_hosts_register_as_a_cluster_with_probed_resources_network_and_host_keys(api, pool):
    resp = post_fleet(api, fleet_configuration(pool))
    assert resp.status_code == 202, resp.content
    assert "PRIVATE KEY" not in resp.content.decode()
    assert settled(api, "pd")["status"] == "active"
    fleet = Fleet.objects.get(name="pd")
    assert (fleet.backend, fleet.placement, fleet.network) == ("ssh", "cluster", str(pool.network))
    assert fleet.private_key == pool.private_key
    assert "private_key" not in str(fleet.configuration)

    group = InstanceGroup.objects.get(fleet=fleet)
    assert (group.name, group.kind, group.status) == ("pd", "cluster", "active")
    instances = list(fleet.instances.order_by("index"))
    assert [i.name for i in instances] == ["pd-0", "pd-1", "pd-2"]
    l40s = {"name": "L40S", "memory_gb": 45.0, "vendor": "nvidia"}
    for inst, host, gpus in zip(instances, pool, [[], [l40s, l40s], [l40s, l40s]], strict=True):
        assert (inst.status, inst.backend, inst.group_id) == ("idle", "ssh", group.id)
        assert (inst.hostname, inst.port, inst.username) == (host.address, host.port, pool.user)
        assert inst.internal_ip == host.address
        assert ipaddress.ip_address(inst.internal_ip) in pool.network
        assert inst.host_key == host.host_key, "the key the host presented is pinned on first contact"
        assert inst.private_key_encrypted == "", "hosts share the fleet's key"
        assert inst.resources["gpus"] == gpus
        assert inst.resources["tpu"] is None
        assert inst.resources["cpus"] >= 1 and inst.resources["memory_gb"] > 0 and inst.resources["disk_gb"] > 0
        assert inst.resources["cpu_arch"] in ("x86", "arm")


def test_registration_leaves_a_running_runner_agent_on_every_host(api, pool):
    assert register(api, fleet_configuration(pool))["status"] == "active"
    for inst in Instance.objects.filter(fleet__name="pd"):
        host = SSHRunnerHost(inst.ssh_target(), timeout=10)
        try:
            assert host.status()["agent_alive"] is True
        finally:
            host.close()


def test_a_host_with_its_own_key_keeps_it_encrypted_on_its_instance(api, pool):
    conf = fleet_configuration(pool, hosts=[pool[0], pool[1]])
    conf["ssh_config"]["private_key"] = None
    conf["ssh_config"]["hosts"][0]["private_key"] = pool.private_key
    conf["ssh_config"]["hosts"][1]["private_key"] = pool.private_key
    assert register(api, conf)["status"] == "active"
    fleet = Fleet.objects.get(name="pd")
    assert fleet.private_key == pool.private_key
    assert all(i.ssh_target().private_key == pool.private_key for i in fleet.instances.all())


def test_an_unused_address_in_the_hosts_subnet_is_refused_naming_it(api, pool):
    unused = str(list(pool.network.hosts())[200])
    conf = fleet_configuration(pool, hosts=[pool[0]])
    conf["ssh_config"]["hosts"].append({"hostname": unused, "port": 22})
    msg = refused(api, conf, ["ssh_config", "hosts", 1])
    assert f"{unused}:22" in msg
    assert "cannot reach" in msg


def test_a_refused_registration_stops_the_runner_it_started_on_the_good_hosts(api, pool):
    conf = fleet_configuration(pool, hosts=[pool[0]])
    conf["ssh_config"]["hosts"].append({"hostname": pool[1].address, "port": 2222})
    refused(api, conf, ["ssh_config", "hosts", 1])
    host = SSHRunnerHost(pool[0].target(), timeout=10)
    try:
        assert host.status()["agent_alive"] is False
    finally:
        host.close()


def test_a_wrong_port_is_refused_naming_host_and_port(api, pool):
    conf = fleet_configuration(pool, hosts=[pool[0], pool[1]])
    conf["ssh_config"]["hosts"][1]["port"] = 2222
    msg = refused(api, conf, ["ssh_config", "hosts", 1])
    assert f"{pool[1].address}:2222" in msg
    assert "cannot reach" in msg


def test_closed_open_silent_and_unresolvable_ports_all_read_the_same(api, pool):
    # Registration must not work as a port scanner: whether a port is closed, open but not sshd, on an
    # address nobody answers at, or a name that does not resolve, the user reads one message.
    server = pool[1].netns_popen(["python3", "-m", "http.server", "8000", "--bind", "0.0.0.0"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: pool[1].netns_exec("python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000), 1)\"").returncode == 0,
                   timeout=15, what="an HTTP server on host1:8000")
        unused = str(list(pool.network.hosts())[200])
        cases = {(pool[1].address, 2222): "closed", (pool[1].address, 8000): "open, not sshd",
                 (unused, 22): "nobody answers", ("no-such-host.invalid", 22): "unresolvable"}
        seen = {}
        for (hostname, port), case in cases.items():
            conf = fleet_configuration(pool, hosts=[])
            conf["ssh_config"]["hosts"] = [{"hostname": hostname, "port": port}]
            msg = refused(api, conf, ["ssh_config", "hosts", 0])
            seen[case] = msg.replace(f"{hostname}:{port}", "HOST:PORT")
        assert len(set(seen.values())) == 1, seen
        assert "cannot reach HOST:PORT" in seen["closed"]
    finally:
        server.kill()
        server.wait()


def test_a_key_the_hosts_do_not_authorize_is_refused_for_each_host(api, pool):
    stranger, _public = _ed25519_keypair()
    conf = fleet_configuration(pool, hosts=[pool[2]])
    conf["ssh_config"]["private_key"] = stranger
    msg = refused(api, conf, ["ssh_config", "hosts", 0])
    assert pool[2].address in msg
    assert "authorized_keys" in msg


def test_an_unknown_user_is_refused_naming_the_user(api, pool):
    conf = fleet_configuration(pool, hosts=[pool[0]])
    conf["ssh_config"]["user"] = "nosuchuser"
    msg = refused(api, conf, ["ssh_config", "hosts", 0])
    assert "nosuchuser" in msg and pool[0].address in msg


def test_a_host_listed_twice_is_refused(api, pool):
    conf = fleet_configuration(pool, hosts=[pool[0], pool[1], pool[0]])
    msg = refused(api, conf, ["ssh_config", "hosts", 2])
    assert pool[0].address in msg and "twice" in msg


def test_a_host_already_in_another_projects_fleet_is_refused(api, pool):
    from projects.models import Project
    from tests.ssh_e2e.helpers import registered_fleet

    other = Project.objects.create(name="other")
    registered_fleet(other, {"configuration": fleet_configuration(pool, name="theirs", hosts=[pool[1]])})
    msg = refused(api, fleet_configuration(pool, hosts=[pool[0], pool[1]]), ["ssh_config", "hosts", 1])
    assert f"{pool[1].address}:{pool[1].port}" in msg
    assert "another project" in msg
    assert "theirs" not in msg and "other" not in msg.replace("another", ""), "another project's names stay hidden"


def test_an_identity_file_is_never_read_on_the_server_whether_or_not_it_exists(api, pool):
    # The server's own files are not the user's keys: a path that exists on the server (here the very
    # key the hosts accept) is refused exactly like one that does not, and no host is contacted.
    messages = []
    before = runner_processes(pool[0])
    for path in (str(pool.private_key_path), "/no/such/key"):
        conf = fleet_configuration(pool, hosts=[pool[0]])
        conf["ssh_config"]["private_key"] = None
        conf["ssh_config"]["identity_file"] = path
        msg = refused(api, conf, ["ssh_config", "hosts", 0, "identity_file"])
        assert "private_key" in msg and path not in msg
        messages.append(msg)
    assert messages[0] == messages[1]
    assert runner_processes(pool[0]) == before, "nothing was started on the host"


def test_a_second_cluster_fleet_with_the_same_name_gets_its_group_name_from_the_fleet(api, pool, project):
    # A live group already holds the fleet's name (say, a TPU pod): the cluster group takes <fleet>-cluster.
    InstanceGroup.objects.create(project=project, name="pd", kind="tpu_pod")
    assert register(api, fleet_configuration(pool, hosts=[pool[0]]))["status"] == "active"
    assert InstanceGroup.objects.get(fleet__name="pd").name == "pd-cluster"


def test_the_stored_host_key_is_checked_on_later_connections(api, pool):
    assert register(api, fleet_configuration(pool, hosts=[pool[0]]))["status"] == "active"
    inst = Instance.objects.get(name="pd-0")
    Instance.objects.filter(pk=inst.pk).update(host_key=pool[1].host_key)
    inst.refresh_from_db()
    host = SSHRunnerHost(inst.ssh_target(), timeout=5)
    try:
        with pytest.raises(HostKeyMismatch):
            host.status()
    finally:
        host.close()


def test_keys_are_never_stored_in_clear(api, pool):
    assert register(api, fleet_configuration(pool))["status"] == "active"
    fleet = Fleet.objects.get(name="pd")
    assert pool.private_key not in fleet.private_key_encrypted
    assert crypto.decrypt(fleet.private_key_encrypted) == pool.private_key


def test_a_cluster_over_two_networks_is_refused_naming_both(api, pool, far_pool):
    conf = fleet_configuration(pool, hosts=[pool[0]])
    conf["ssh_config"]["hosts"].append(
        {"hostname": far_pool[0].address, "port": far_pool[0].port, "private_key": far_pool.private_key})
    msg = refused(api, conf, ["placement"])
    assert str(pool.network) in msg and str(far_pool.network) in msg
    far = Instance.objects.filter(hostname=far_pool[0].address).latest("id")
    assert (far_pool[0].muster_home / far.backend_data["runner_home"] / "bin" / "muster_runner.pyz").exists(), \
        "the runner was started there while registering"
    host = SSHRunnerHost(far.ssh_target(), timeout=10)
    try:
        assert host.status()["agent_alive"] is False, "the runners started while probing are stopped again"
    finally:
        host.close()


def test_hosts_on_two_networks_register_without_a_common_network_when_placement_is_any(api, pool, far_pool):
    conf = fleet_configuration(pool, hosts=[pool[0]], placement="any")
    conf["ssh_config"]["hosts"].append(
        {"hostname": far_pool[0].address, "port": far_pool[0].port, "private_key": far_pool.private_key})
    assert register(api, conf)["status"] == "active"
    fleet = Fleet.objects.get(name="pd")
    assert fleet.network == ""
    assert not InstanceGroup.objects.filter(fleet=fleet).exists(), "only cluster fleets form a group"
    near, far = fleet.instances.order_by("index")
    assert near.private_key_encrypted == "" and fleet.private_key == pool.private_key
    assert crypto.decrypt(far.private_key_encrypted) == far_pool.private_key, "a host's own key stays its own"
