"""The local backend with an image: the server machine's Docker, asked at plan and submit. Where
only local fleets could take the run and Docker does not answer there, a 400 naming `image`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from events.models import Event
from instances.models import Instance
from instances.services.fleets import create_local_fleet
from runs.models import Job, Run
from tests.conftest import token_for
from tests.containers.docker_env import needs_docker
from tests.ssh_e2e.helpers import fleet_configuration, registered_fleet

PLAN, RUNS = "/api/projects/main/runs/plan", "/api/projects/main/runs/"
TASK = "type: task\nname: boxed\nimage: busybox\ncommands: [echo]\n"
GROUPS = """
type: task
name: boxed
groups:
  - {name: plain, nodes: 1, commands: [echo]}
  - {name: boxed, nodes: 1, image: busybox, commands: [echo]}
"""


def with_docker(test):
    """The marks of the container tests (tests/containers/docker_env.py): real dockerds on test hosts."""
    for mark in needs_docker:
        test = mark(test)
    return test


@pytest.fixture
def no_docker(monkeypatch, tmp_path):
    """The server machine's `docker` reaches no daemon (whatever this machine runs)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")


def refusal(fleets: str) -> str:
    return (f"the local fleet {fleets} runs jobs on the server's machine, where Docker does not answer (`docker info` "
            "failed), so a job with an image cannot run there: install Docker on that machine and start it, or "
            "remove `image` to run the commands on the host, or name a fleet whose hosts have Docker in `fleets`")


@pytest.mark.django_db
def test_an_image_run_that_only_local_fleets_could_take_is_a_400_at_plan_and_submit_without_docker(
        api, project, no_docker):
    create_local_fleet(project, "here", 1)
    for path in (PLAN, RUNS):
        answer = api.post(path, {"configuration": TASK}, format="json")
        assert answer.status_code == 400, answer.content
        assert answer.json() == {"errors": [{"loc": ["image"], "msg": refusal("here")}]}
    assert (Run.objects.count(), Job.objects.count()) == (0, 0), "nothing half-created"

    # an image of one group: that group's key is named
    answer = api.post(RUNS, {"configuration": GROUPS}, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["errors"] == [{"loc": ["groups", 1, "image"], "msg": refusal("here")}]

    # naming the local fleet changes nothing; without an image the run goes there as before
    answer = api.post(PLAN, {"configuration": TASK + "fleets: [here]\n"}, format="json")
    assert answer.status_code == 400 and answer.json()["errors"][0]["loc"] == ["image"], answer.content
    answer = api.post(PLAN, {"configuration": TASK.replace("image: busybox\n", "")}, format="json")
    assert answer.status_code == 200 and answer.json()["capacity"]["fits"] is True, answer.content


@pytest.mark.django_db(transaction=True)
def test_muster_plan_and_apply_print_the_400_and_exit_non_zero(project, make_user, live_server, no_docker,
                                                               tmp_path):
    create_local_fleet(project, "here", 1)
    (tmp_path / "task.yml").write_text(TASK)
    env = {**os.environ, "HOME": str(tmp_path), "MUSTER_URL": live_server.url,
           "MUSTER_TOKEN": token_for(make_user("bob")), "MUSTER_PROJECT": "main"}
    for command in (["plan"], ["apply", "-y"]):
        out = subprocess.run([sys.executable, "-m", "cli", *command, "-f", str(tmp_path / "task.yml")], env=env,
                             capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
        assert out.returncode != 0, out.stdout
        assert "image" in out.stderr and "install Docker on that machine and start it" in out.stderr, out.stderr
    assert Run.objects.count() == 0


@with_docker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("named", [False, True])
def test_an_ssh_fleet_with_docker_in_the_project_still_takes_an_image_run(
        docker_cluster, api, project, no_docker, fast_limits, named):
    create_local_fleet(project, "here", 1)
    registered_fleet(project, {"configuration": fleet_configuration(docker_cluster.pool, name="boxes")}, actor="test")
    text = TASK.replace("busybox", docker_cluster.image("worker")) + ("fleets: [here, boxes]\n" if named else "")
    answer = api.post(PLAN, {"configuration": text}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["capacity"]["fleet"] == "boxes", answer.json()["capacity"]
    answer = api.post(RUNS, {"configuration": text}, format="json")
    assert answer.status_code == 201, answer.content
    Run.objects.all().delete()


@with_docker
@pytest.mark.django_db
def test_a_local_fleet_made_before_docker_answered_takes_image_runs_once_it_does(
        docker_cluster, api, project, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    create_local_fleet(project, "here", 1)
    assert Instance.objects.get(fleet__name="here").resources["docker"] is None
    monkeypatch.setenv("DOCKER_HOST", f"unix://{docker_cluster.pool[0].docker_sock}")
    answer = api.post(PLAN, {"configuration": TASK}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["capacity"]["fits"] is True, answer.json()["capacity"]
    inst = Instance.objects.get(fleet__name="here")
    assert inst.resources["docker"]["version"], inst.resources
    assert Event.objects.filter(instance=inst, message__endswith="found: jobs with `image` can run here").exists()
