"""The SSH path: a replica the server cannot reach directly (it listens on its host's own address
for it, inside the host's network namespace) is served through the host's SSH connection, logged
in as the engine logs in (the fleet's key, the recorded host key), with no port opened in the
endpoint's process; a service's port on the host's loopback is not reached that way."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import requests
from django.utils import timezone

from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint, url  # noqa: F401 (the fixture)
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.django_db(transaction=True)]
INNER = "10.254.0.1"  # the host's own address for the replica (DSTACK_NODE_IP), routed nowhere from here


def listening(pid: int) -> set[str]:
    """The TCP ports the process listens on (its sockets' inodes found in /proc/net/tcp*, LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(f"{table}:{fields[1]}")
    return ports


def test_a_replica_only_its_host_reaches_is_served_through_the_hosts_ssh_connection(
        ssh_hosts, endpoint, tmp_path):  # noqa: F811
    from instances.models import Fleet, Instance
    from projects.models import Project
    from runs.models import Job, Run

    host = ssh_hosts(1, mode="netns")[0]
    port = free_port()
    (tmp_path / "index.html").write_text("through ssh\n")
    host.netns_exec(["ip", "addr", "add", f"{INNER}/32", "dev", "lo"], check=True)
    server = host.netns_popen([sys.executable, "-m", "http.server", str(port), "--bind", INNER,
                               "--directory", str(tmp_path)])
    loop_port = free_port()  # a daemon on the host's loopback: no service's port reaches it
    daemon = host.netns_popen([sys.executable, "-m", "http.server", str(loop_port), "--bind", "127.0.0.1",
                               "--directory", str(tmp_path)])
    try:
        knock = (f"import socket; socket.create_connection(('{INNER}', {port}), 2); "
                 f"socket.create_connection(('127.0.0.1', {loop_port}), 2)")
        wait_until(lambda: host.netns_exec([sys.executable, "-c", knock], timeout=10).returncode == 0,
                   timeout=20, what="the replica listening on its host's loopback")
        project, _ = Project.objects.get_or_create(name="main")
        fleet = Fleet.objects.create(project=project, name="hosts", backend="ssh", status="active")
        fleet.private_key = host.private_key
        fleet.save()
        instance = Instance.objects.create(project=project, fleet=fleet, name="hosts-0", backend="ssh", status="busy",
                                           hostname=host.address, port=host.port, internal_ip=INNER,
                                           username=host.user, host_key=host.host_key)
        conf = {"type": "service", "name": "far", "port": port, "auth": False,
                "groups": [{"name": "0", "replicas": {"min": 1, "max": 1}}]}
        run = Run.objects.create(project=project, name="far", configuration=conf, status="running")
        Job.objects.create(run=run, job_num=0, node_group_name="0", spec={}, status="running", instance=instance,
                           ready_at=timezone.now())
        with pytest.raises(requests.ConnectionError):  # not from here: only through the host
            requests.get(f"http://{host.address}:{port}/", timeout=5)
        before = listening(endpoint.proc.pid)
        assert before, "the endpoint's own port is among them: the check sees its process"
        for _ in range(5):
            got = requests.get(url(endpoint, "far", ""), timeout=30)
            assert got.status_code == 200 and got.text == "through ssh\n", got.text
        with requests.get(url(endpoint, "far", "index.html"), stream=True, timeout=30) as got:
            assert got.raw.read() == b"through ssh\n"
        assert listening(endpoint.proc.pid) == before, "the SSH path opened a listening port"
        conf = {**conf, "name": "loop", "port": loop_port}
        run = Run.objects.create(project=project, name="loop", configuration=conf, status="running")
        Job.objects.create(run=run, job_num=0, node_group_name="0", spec={}, status="running", instance=instance,
                           ready_at=timezone.now())
        got = requests.get(url(endpoint, "loop", ""), timeout=30)
        assert got.status_code == 502, (got.status_code, got.text)
    finally:
        for proc in (server, daemon):
            proc.kill()
            proc.wait(10)
