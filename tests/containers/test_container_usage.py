"""A container job's CPU and memory, as its runner samples them on a real Docker host: the
container's processes are Docker's (not in the job's cgroup, without its marker), found from the
container's init process and its descendants."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.containers.docker_env import needs_docker
from tests.runner.runner_helpers import cli_json, job_spec, kill_everything, submit, wait_state
from tests.waiting import wait_until

pytestmark = needs_docker


@pytest.fixture
def runner_home(tmp_path: Path, docker_cluster, monkeypatch):
    """A runner home on this machine whose docker CLI talks to the first test host's daemon."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{docker_cluster.pool[0].docker_sock}")
    home = tmp_path / "home"
    home.mkdir()
    cli_json(home, "ensure-agent")
    yield home
    kill_everything(home)


def test_a_busy_container_jobs_cpu_and_memory_are_sampled(runner_home, docker_cluster):
    image = docker_cluster.push("usage", "usage-image")
    job_id = str(uuid.uuid4())
    # a busy child of the container's shell: the descendants of its init process are counted
    submit(runner_home, job_id, job_spec(job_id, ["sh -c 'while :; do :; done' & wait"],
                                         container={"image": image, "pull_timeout": 60}))
    wait_state(runner_home, job_id, ("running",), timeout=90)

    def busy():
        usage = cli_json(runner_home, "status")["jobs"][job_id].get("usage") or {}
        return usage if (usage.get("cpu_percent") or 0) > 0 and (usage.get("memory_bytes") or 0) > 0 else None

    usage = wait_until(busy, timeout=60, what="a sample with the container's CPU and memory")
    assert usage["gpus"] == [] and usage["cpus"] >= 1
    (runner_home / "jobs" / job_id / "stop").touch()
    wait_state(runner_home, job_id, ("terminated",), timeout=60)
    assert docker_cluster.leftover_containers() == {}
