"""Registering SSH fleets against hosts that are hostile, odd, or the same machine under another name.

Real sshd hosts in network namespaces, reached through the REST API as a member would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from backends.runner_archive import runner_archive
from backends.ssh.errors import HostNotAllowed
from backends.ssh.runner_host import SSHRunnerHost
from instances.models import Instance
from projects.models import Project
from tests.ssh_e2e.helpers import (
    fleet_configuration,
    needs_netns,
    post_fleet,
    refused,
    register,
    registered_fleet,
    runner_processes,
    settled,
)
from tests.sshhosts import _run
from tests.test_settings_and_compose import PROD

# Registration runs in a Celery task: a real worker, and a database the worker's thread can see.
pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _worker(celery_worker):
    return celery_worker


@pytest.fixture(autouse=True)
def short_ssh_timeouts(settings):
    settings.MUSTER = {**settings.MUSTER, "SSH_TIMEOUT": 5, "SSH_REGISTER_TIMEOUT": 30}


def agent_alive(inst: Instance) -> bool:
    host = SSHRunnerHost(inst.ssh_target(), timeout=10)
    try:
        return host.status()["agent_alive"] is True
    finally:
        host.close()


# ---- one machine, two spellings (11.1) ------------------------------------------------------------


def _second_address(host) -> str:
    """Give the host a second address on its network: the same machine, spelled differently."""
    net = host.pool.network
    alias = str(list(net.hosts())[100 + host.index])
    _run(["ip", "-n", host.netns, "addr", "add", f"{alias}/{net.prefixlen}", "dev", "eth0"])
    return alias


def test_one_machine_under_another_address_cannot_join_a_second_projects_fleet(api, ssh_hosts):
    pool = ssh_hosts(1, mode="netns")
    alias = _second_address(pool[0])
    other = Project.objects.create(name="elsewhere")
    theirs = registered_fleet(other, {"configuration": fleet_configuration(pool, name="secret-fleet")})
    before = runner_processes(pool[0])

    conf = fleet_configuration(pool, name="mine", hosts=[])
    conf["ssh_config"]["hosts"] = [{"hostname": alias, "port": 22}]
    msg = refused(api, conf, ["ssh_config", "hosts", 0])
    assert f"{alias}:22" in msg and "host key" in msg and "another project" in msg
    assert "secret-fleet" not in msg and "elsewhere" not in msg, "another project's names stay hidden"
    assert runner_processes(pool[0]) == before, "no second runner was started on the machine"
    assert agent_alive(theirs.instances.get()), "the other project's runner is untouched"


def test_one_machine_listed_twice_under_two_addresses_is_refused(api, ssh_hosts):
    pool = ssh_hosts(1, mode="netns")
    alias = _second_address(pool[0])
    conf = fleet_configuration(pool)
    conf["ssh_config"]["hosts"].append({"hostname": alias, "port": 22})
    msg = refused(api, conf, ["ssh_config", "hosts", 1])
    assert "same machine as hosts[0]" in msg


def test_each_registration_gets_a_runner_home_no_other_fleet_can_share(api, ssh_hosts):
    # Same fleet name, same login, two projects one after the other: the runner homes differ, so
    # whatever the first left behind (job files, a stop request) never reaches the second's jobs.
    pool = ssh_hosts(1, mode="netns")
    first = registered_fleet(Project.objects.create(name="p1"), {"configuration": fleet_configuration(pool, name="f")})
    home1 = first.instances.get().backend_data["runner_home"]
    from tests.ssh_e2e.helpers import deleted_fleet

    deleted_fleet(first)
    assert register(api, fleet_configuration(pool, name="f"))["status"] == "active"
    second = Instance.objects.get(project__name="main", name="f-0")
    home2 = second.backend_data["runner_home"]
    assert home1 != home2 and "f" not in home2.split("/")
    assert (pool[0].muster_home / home2 / "bin" / "muster_runner.pyz").exists()
    assert agent_alive(second)


# ---- host keys (11.12) ----------------------------------------------------------------------------


def test_a_known_hosts_line_pins_the_host_key(api, ssh_hosts):
    pool = ssh_hosts(1, mode="netns")
    conf = fleet_configuration(pool)
    conf["ssh_config"]["hosts"][0]["host_key"] = f"{pool[0].address} {pool[0].host_key} root@host0"
    assert register(api, conf)["status"] == "active", "a matching key registers"
    assert Instance.objects.get(name="pd-0").host_key == pool[0].host_key


def test_a_host_presenting_another_key_than_given_is_refused_with_both_fingerprints(api, ssh_hosts):
    pool = ssh_hosts(2, mode="netns")
    conf = fleet_configuration(pool, hosts=[pool[0]])
    conf["ssh_config"]["hosts"][0]["host_key"] = pool[1].host_key  # what a man in the middle would not have
    msg = refused(api, conf, ["ssh_config", "hosts", 0])
    assert pool[0].host_key_fingerprint in msg, "the key seen"
    assert pool[1].host_key_fingerprint in msg, "the key expected"


# ---- what the host needs (12.12) ------------------------------------------------------------------


def test_a_host_without_the_sftp_subsystem_registers_and_runs_its_agent(api, ssh_hosts):
    pool = ssh_hosts(1, mode="netns")
    pool[0].reconfigure_sshd(sftp=False)
    assert register(api, fleet_configuration(pool))["status"] == "active"
    inst = Instance.objects.get(name="pd-0")
    runner = pool[0].muster_home / inst.backend_data["runner_home"] / "bin" / "muster_runner.pyz"
    source = runner_archive()
    assert runner.read_bytes() == source.read_bytes()
    assert oct(runner.stat().st_mode & 0o777) == oct(0o755)
    assert agent_alive(inst)


# ---- hostile output (11.5) ------------------------------------------------------------------------


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_host_that_prints_without_end_fails_with_the_cap_and_server_memory_stays_bounded(api, ssh_hosts, settings):
    settings.MUSTER = {**settings.MUSTER, "SSH_OUTPUT_LIMIT": 2 << 20, "SSH_TIMEOUT": 8}
    pool = ssh_hosts(1, mode="netns")
    # Every session's command is replaced by an endless stream, as a hostile ~/.bashrc would do.
    pool[0].reconfigure_sshd(extra=["ForceCommand yes muster-hostile-host-output-line"])
    baseline = _rss_bytes()
    peak = [baseline]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        msg = refused(api, fleet_configuration(pool), ["ssh_config", "hosts", 0])
    finally:
        done.set()
        sampler.join()
    assert "printed more than 2097152 bytes" in msg and "~/.bashrc" in msg
    assert peak[0] - baseline < 64 << 20, f"memory grew by {(peak[0] - baseline) >> 20} MiB"


def test_the_apply_answers_before_a_slow_host_is_done_and_the_fleet_fails_later(api, ssh_hosts):
    # A host whose every command hangs: the request must not wait for it (a web worker would be
    # held for the whole SSH timeout); the registration task finds out and fails the fleet.
    pool = ssh_hosts(1, mode="netns")
    pool[0].reconfigure_sshd(extra=["ForceCommand sleep 600"])
    resp = post_fleet(api, fleet_configuration(pool))
    assert resp.status_code == 202, resp.content
    assert resp.json()["status"] == "pending"
    fleet = settled(api, "pd")
    assert fleet["status"] == "failed"
    assert "did not finish within 5 s" in fleet["errors"][0]["msg"]
    assert fleet["instances"][0]["registration"].startswith("failed: ")


# ---- who the server may connect to (11.6) ---------------------------------------------------------


def test_a_denied_network_is_refused_without_connecting(api, ssh_hosts, settings):
    pool = ssh_hosts(1, mode="netns")
    settings.MUSTER = {**settings.MUSTER, "SSH_HOSTS_DENY": [str(pool.network)]}
    conf = fleet_configuration(pool)
    msg = refused(api, conf, ["ssh_config", "hosts", 0])
    assert "not an address this server connects to" in msg
    log = Path(pool[0]._log).read_text()
    assert "Accepted publickey" not in log and "Connection from" not in log.split("Server listening")[-1]


def test_an_allow_list_admits_only_its_networks(api, ssh_hosts, settings):
    pool = ssh_hosts(1, mode="netns")
    settings.MUSTER = {**settings.MUSTER, "SSH_HOSTS_ALLOW": ["192.0.2.0/24"]}
    msg = refused(api, fleet_configuration(pool), ["ssh_config", "hosts", 0])
    assert "not an address this server connects to" in msg
    settings.MUSTER = {**settings.MUSTER, "SSH_HOSTS_ALLOW": [str(pool.network)]}
    assert register(api, fleet_configuration(pool))["status"] == "active"


def test_a_registered_host_on_a_network_denied_later_is_not_connected_to(api, ssh_hosts, settings):
    pool = ssh_hosts(1, mode="netns")
    assert register(api, fleet_configuration(pool))["status"] == "active"
    settings.MUSTER = {**settings.MUSTER, "SSH_HOSTS_DENY": [str(pool.network)]}
    host = SSHRunnerHost(Instance.objects.get(name="pd-0").ssh_target(), timeout=5)
    try:
        with pytest.raises(HostNotAllowed):
            host.status()
    finally:
        host.close()


PRODUCTION_DENY = """
import django, json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "muster.settings")
django.setup()
from django.conf import settings
print(json.dumps(settings.MUSTER["SSH_HOSTS_DENY"]))
"""


def test_production_denies_loopback_and_cloud_metadata_by_default(api, settings, tmp_path):
    env = {**os.environ, **PROD, "MUSTER_DATA_DIR": str(tmp_path)}
    env.pop("MUSTER_SSH_HOSTS_DENY", None)
    out = subprocess.run([sys.executable, "-c", PRODUCTION_DENY], env=env, capture_output=True, text=True,
                         timeout=60, check=True, cwd=Path(__file__).resolve().parents[2]).stdout
    import json

    deny = json.loads(out.strip().splitlines()[-1])
    settings.MUSTER = {**settings.MUSTER, "SSH_HOSTS_DENY": deny}
    for hostname in ("169.254.169.254", "127.0.0.1", "localhost", "::1"):
        conf = {"type": "fleet", "name": "pd", "ssh_config": {
            "user": "root", "private_key": _any_key(), "hosts": [{"hostname": hostname}]}}
        msg = refused(api, conf, ["ssh_config", "hosts", 0])
        assert "not an address this server connects to" in msg, (hostname, msg)


def _any_key() -> str:
    from tests.sshhosts import _ed25519_keypair

    return _ed25519_keypair()[0]
