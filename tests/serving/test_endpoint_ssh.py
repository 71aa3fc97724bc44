"""The SSH path: a replica the server cannot reach directly (it listens on its host's loopback,
inside the host's network namespace) is served through the host's SSH connection, logged in as
the engine logs in (the fleet's key, the recorded host key)."""

from __future__ import annotations

import sys

import pytest
import requests
from django.utils import timezone

from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint, url  # noqa: F401 (the fixture)
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.django_db(transaction=True)]


def test_a_replica_only_its_host_reaches_is_served_through_the_hosts_ssh_connection(
        ssh_hosts, endpoint, tmp_path):  # noqa: F811
    from instances.models import Fleet, Instance
    from projects.models import Project
    from runs.models import Job, Run

    host = ssh_hosts(1, mode="netns")[0]
    port = free_port()
    (tmp_path / "index.html").write_text("through ssh\n")
    server = host.netns_popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(tmp_path)])
    try:
        knock = f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)"
        wait_until(lambda: host.netns_exec([sys.executable, "-c", knock], timeout=10).returncode == 0,
                   timeout=20, what="the replica listening on its host's loopback")
        project, _ = Project.objects.get_or_create(name="main")
        fleet = Fleet.objects.create(project=project, name="hosts", backend="ssh", status="active")
        fleet.private_key = host.private_key
        fleet.save()
        instance = Instance.objects.create(project=project, fleet=fleet, name="hosts-0", backend="ssh", status="busy",
                                           hostname=host.address, port=host.port, internal_ip=host.address,
                                           username=host.user, host_key=host.host_key)
        conf = {"type": "service", "name": "far", "port": port, "auth": False,
                "groups": [{"name": "0", "replicas": {"min": 1, "max": 1}}]}
        run = Run.objects.create(project=project, name="far", configuration=conf, status="running")
        Job.objects.create(run=run, job_num=0, node_group_name="0", spec={}, status="running", instance=instance,
                           ready_at=timezone.now())
        with pytest.raises(requests.ConnectionError):  # not from here: only through the host
            requests.get(f"http://{host.address}:{port}/", timeout=5)
        for _ in range(5):
            got = requests.get(url(endpoint, "far", ""), timeout=30)
            assert got.status_code == 200 and got.text == "through ssh\n", got.text
        with requests.get(url(endpoint, "far", "index.html"), stream=True, timeout=30) as got:
            assert got.raw.read() == b"through ssh\n"
    finally:
        server.kill()
        server.wait(10)
