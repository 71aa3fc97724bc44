"""The test infrastructure itself: each SSH test host has its own dockerd, reached over SSH."""

from __future__ import annotations

import subprocess

from tests.containers.docker_env import needs_docker

pytestmark = needs_docker


def ssh(host, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(host.private_key_path), "-o", "StrictHostKeyChecking=no", "-o",
         "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-p", str(host.port),
         f"{host.user}@{host.address}", command],
        capture_output=True, text=True, timeout=60)


def test_each_host_pulls_from_the_registry_and_runs_with_its_own_address(docker_cluster):
    ref = docker_cluster.push("infra", "infra-marker")
    for host in docker_cluster.pool:
        out = ssh(host, f"docker run --rm --network host {ref} sh -c 'cat /etc/test-image-marker; ip -4 addr'")
        assert out.returncode == 0, out.stderr
        assert "infra-marker" in out.stdout
        assert f"inet {host.address}/" in out.stdout
    assert docker_cluster.pool[0].docker_sock != docker_cluster.pool[1].docker_sock
    docker_cluster.forget(ref)
    assert ref not in docker_cluster.pool[1].docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
    assert docker_cluster.leftover_containers() == {}
