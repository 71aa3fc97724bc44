"""What a run's containers may do to a host, on real Docker hosts: the runner never reads an image
as a docker flag, and it refuses what the fleet's policy does not allow (privileged, host paths
outside `volumes.allowed_prefixes`, with symlinks and `..` resolved on the host), whatever the
server sent; through the whole system, placement sends a run only to a fleet that allows it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from runs.services import logs
from runs.services.submission import submit_run
from tests.containers.docker_env import needs_docker
from tests.engine.helpers import Beat, wait_for_run
from tests.runner.runner_helpers import cli_json, job_spec, kill_everything, submit, wait_state
from tests.ssh_e2e.helpers import fleet_configuration, registered_fleet
from tests.waiting import job_states

pytestmark = needs_docker

SHADOW_CHECK = ["test -r /host/etc/shadow && echo SHADOW_READABLE", "cat /data/in/secret.txt || true"]


# ---- the runner, driven directly (as the server would, with a spec it did not check) -----------


@pytest.fixture
def runner_home(tmp_path: Path, docker_cluster, monkeypatch):
    """A runner home on this machine whose docker CLI talks to the first test host's daemon."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{docker_cluster.pool[0].docker_sock}")
    home = tmp_path / "home"
    home.mkdir()
    cli_json(home, "ensure-agent")  # as the server does: the agent starts each submitted job
    yield home
    kill_everything(home)


@pytest.fixture(scope="module")
def image(docker_cluster):
    return docker_cluster.push("policy", "policy-image")


def run_direct(home: Path, container: dict, commands: list[str] | None = None) -> dict:
    job_id = str(uuid.uuid4())
    submit(home, job_id, job_spec(job_id, commands or ["echo ran"], container={"pull_timeout": 60, **container}))
    return dict(wait_state(home, job_id, ("done", "failed"), timeout=90), job=job_id)


def output_of(home: Path, status: dict) -> str:
    log = home / "jobs" / status["job"] / "output.log"
    return log.read_text() if log.exists() else ""


@pytest.mark.parametrize("hostile", ["-v/:/host", "--help", "--privileged"])
def test_an_image_starting_with_a_dash_is_never_read_as_a_docker_flag(runner_home, docker_cluster, hostile):
    status = run_direct(runner_home, {"image": hostile, "policy": {"allow_privileged": True,
                                                                    "allowed_prefixes": ["/"]}})
    assert status["state"] == "failed", status
    assert status["reason"] == "creating_container_error", status
    # Docker took it as an image reference (and refused it as one), not as an option
    assert "invalid reference format" in status["error"], status["error"]
    assert "flag" not in status["error"] and "Usage" not in status["error"], status["error"]
    assert docker_cluster.leftover_containers() == {}


def test_the_runner_refuses_privileged_unless_the_fleet_allows_it(runner_home, image, docker_cluster):
    for policy in (None, {"allow_privileged": False, "allowed_prefixes": []}):
        container = {"image": image, "privileged": True, **({"policy": policy} if policy else {})}
        status = run_direct(runner_home, container)
        assert status["state"] == "failed", status
        assert "does not allow privileged containers" in status["error"], status
        assert "ran" not in output_of(runner_home, status)
    assert docker_cluster.leftover_containers() == {}


@pytest.fixture
def host_dirs(tmp_path: Path):
    """/…/data with a file, a symlink to / inside it, and a secret outside it."""
    data = tmp_path / "data"
    (data / "in").mkdir(parents=True)
    (data / "in" / "secret.txt").write_text("DATA-MARKER\n")
    (data / "root").symlink_to("/")
    (data / "up").symlink_to("..")
    return data


@pytest.mark.parametrize("source", ["root", "up/..", "in/../.."])
def test_the_runner_resolves_symlinks_and_dotdot_before_it_allows_a_host_path(runner_home, image, host_dirs,
                                                                              docker_cluster, source):
    container = {"image": image, "volumes": [f"{host_dirs}/{source}:/host"],
                 "policy": {"allow_privileged": False, "allowed_prefixes": [str(host_dirs)]}}
    status = run_direct(runner_home, container, SHADOW_CHECK)
    assert status["state"] == "failed", status
    assert "does not allow mounting host path" in status["error"] and str(host_dirs) in status["error"], status
    assert "SHADOW_READABLE" not in output_of(runner_home, status)
    assert docker_cluster.leftover_containers() == {}


def test_a_host_path_under_an_allowed_prefix_is_mounted(runner_home, image, host_dirs):
    container = {"image": image, "volumes": [f"{host_dirs}/in:/data/in"],
                 "policy": {"allow_privileged": False, "allowed_prefixes": [str(host_dirs)]}}
    status = run_direct(runner_home, container, ["cat /data/in/secret.txt"])
    assert status["state"] == "done", (status, output_of(runner_home, status))
    assert "DATA-MARKER" in output_of(runner_home, status)


# ---- through the whole system: a member's run on real SSH fleets, a real worker -----------------


@pytest.fixture
def project(api, fast_limits):
    from projects.models import Project

    return Project.objects.get(name="main")


@pytest.fixture
def beat(celery_worker):
    with Beat() as beat:
        yield beat


def policy_fleet(pool, name: str, host, **keys) -> dict:
    return {**fleet_configuration(pool, name, hosts=[host]), **keys}


@pytest.mark.django_db(transaction=True)
def test_a_symlink_under_an_allowed_prefix_does_not_reach_the_hosts_root(docker_cluster, image, host_dirs,
                                                                         project, make_user, beat):
    # The server sees /…/data/root, under the prefix; only the host knows it is a link to /.
    pool = docker_cluster.pool
    registered_fleet(project, {"configuration": policy_fleet(pool, "data", pool[0],
                                                        volumes={"allowed_prefixes": [str(host_dirs)]})},
                actor="test")
    text = f"""
type: task
name: peek
fleets: [data]
image: {image}
volumes: ["{host_dirs}/root:/host"]
commands: {SHADOW_CHECK!r}
"""
    run = wait_for_run(submit_run(project, make_user("mallory", role="user"), {"configuration": text}).name,
                       timeout=90)
    job = run.current_jobs().get()
    assert run.status == "failed", job_states(run)
    assert job.termination_reason == "creating_container_error", job_states(run)
    assert "does not allow mounting host path" in job.termination_message, job.termination_message
    assert b"SHADOW_READABLE" not in logs.read(job)
    assert docker_cluster.leftover_containers() == {}


@pytest.mark.django_db(transaction=True)
def test_a_run_goes_only_to_the_fleet_that_allows_its_volume_and_reads_the_data_there(
        docker_cluster, image, host_dirs, project, beat):
    pool = docker_cluster.pool
    registered_fleet(project, {"configuration": policy_fleet(pool, "locked", pool[1])}, actor="test")
    registered_fleet(project, {"configuration": policy_fleet(pool, "open", pool[2],
                                                        volumes={"allowed_prefixes": [str(host_dirs)]})},
                actor="test")
    text = f"""
type: task
name: reads-data
fleets: [locked, open]
image: {image}
volumes: ["{host_dirs}/in:/data/in"]
commands: ["cat /data/in/secret.txt"]
"""
    run = wait_for_run(submit_run(project, None, {"configuration": text}).name, timeout=90)
    job = run.current_jobs().get()
    assert run.status == "done", job_states(run)
    assert job.instance.fleet.name == "open", "locked fits too, but does not allow the volume"
    assert b"DATA-MARKER" in logs.read(job)
    assert docker_cluster.leftover_containers() == {}
