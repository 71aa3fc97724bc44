"""`muster instances` says which hosts can run jobs with `image`: the Docker version the probe found."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import token_for
from tests.containers.docker_env import needs_docker
from tests.ssh_e2e.helpers import fleet_configuration, registered_fleet

pytestmark = [*needs_docker, pytest.mark.django_db(transaction=True)]


def test_instances_shows_the_docker_version_of_each_host_and_no_where_there_is_none(
        docker_cluster, ssh_hosts, live_server, make_user):
    from projects.models import Project

    token = token_for(make_user("alice"))
    project = Project.objects.get(name="main")
    registered_fleet(project, {"configuration": fleet_configuration(docker_cluster.pool, name="with")}, actor="test")
    plain = ssh_hosts(1, mode="netns")
    registered_fleet(project, {"configuration": fleet_configuration(plain, name="without", placement="any")},
                actor="test")
    version = docker_cluster.pool[0].docker("version", "--format", "{{.Server.Version}}").stdout.strip()

    env = {**os.environ, "HOME": str(docker_cluster.pool.root), "MUSTER_URL": live_server.url,
           "MUSTER_TOKEN": token, "MUSTER_PROJECT": "main"}
    out = subprocess.run([sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())", "instances"], env=env, capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    rows = {word: line.split() for line in out.stdout.splitlines() for word in line.split()
            if word.startswith(("with-", "without-"))}
    assert "DOCKER" in out.stdout
    assert [rows[f"with-{i}"][-1] for i in range(3)] == [version] * 3, out.stdout
    assert rows["without-0"][-1] == "no", out.stdout
