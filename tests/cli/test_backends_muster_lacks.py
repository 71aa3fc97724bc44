"""A dstack configuration naming a backend Muster does not have (`backends: [crusoe]`, from dstack's
own examples) is accepted as dstack accepts it, with a warning: the run goes only to fleets of the
named kinds, so with none of them it finds no capacity, as it would under dstack."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from instances.services.fleets import create_local_fleet
from tests.conftest import token_for
from tests.dstack_cli.bodies import RUN_SPEC, TASK, dstack_client, post
from tests.engine.helpers import wait_for_run

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]
CRUSOE = "type: task\nname: {name}\nbackends: {backends}\ncommands: [echo ran]\n"


@pytest.fixture
def local_fleet(fast_limits):
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    fleet = create_local_fleet(project, "local", 1, placement="any")
    yield fleet
    from engine.groups import terminate_fleet_instances

    terminate_fleet_instances(fleet)


@pytest.mark.django_db
def test_the_plan_accepts_a_backend_muster_lacks_with_a_warning_and_no_capacity(make_user):
    from rest_framework.test import APIClient

    from projects.models import Project

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(make_user('alice'))}")
    project, _ = Project.objects.get_or_create(name="main")
    create_local_fleet(project, "local", 1, placement="any")
    resp = api.post("/api/projects/main/runs/plan",
                    {"configuration": CRUSOE.format(name="c", backends="[crusoe]")}, format="json")
    assert resp.status_code == 200, resp.json()
    (warning,) = [w["message"] for w in resp.json()["warnings"] if w["field"] == "backends"]
    assert "Muster has no `crusoe` backend" in warning and "finds no capacity" in warning, warning
    capacity = resp.json()["capacity"]
    assert capacity["fits"] is False and "`backends` (crusoe)" in capacity["reasons"][0], capacity

    # with a kind Muster has beside it, the run goes to fleets of that kind
    resp = api.post("/api/projects/main/runs/plan",
                    {"configuration": CRUSOE.format(name="c", backends="[crusoe, local]")}, format="json")
    assert resp.status_code == 200 and resp.json()["capacity"]["fits"] is True, resp.json()
    (warning,) = [w["message"] for w in resp.json()["warnings"] if w["field"] == "backends"]
    assert "goes only to the project's local fleets" in warning, warning
    # a name that is no backend at all is still refused, as dstack refuses it
    resp = api.post("/api/projects/main/runs/plan",
                    {"configuration": CRUSOE.format(name="c", backends="[crusoee]")}, format="json")
    assert resp.status_code == 400 and resp.json()["errors"][0]["loc"] == ["backends"], resp.json()


@pytest.mark.django_db
def test_the_dstack_api_plans_a_backend_muster_lacks(make_user):
    alice = dstack_client(make_user("alice"))
    spec = {**RUN_SPEC, "configuration": {**TASK, "backends": ["crusoe"]}}
    resp = post(alice, "project/main/runs/get_plan", {"run_spec": spec})
    assert resp.status_code == 200, resp.content


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_muster_apply_warns_and_the_run_finds_no_capacity(local_fleet, celery_worker, live_server, make_user,
                                                          tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "MUSTER_URL": live_server.url, "MUSTER_PROJECT": "main",
           "MUSTER_TOKEN": token_for(make_user("alice", role="admin"))}
    path = tmp_path / "crusoe.yml"
    path.write_text(CRUSOE.format(name="crusoe", backends="[crusoe]"))
    result = subprocess.run([*MUSTER, "apply", "-f", str(path), "-y"], env=env, capture_output=True, text=True,
                            timeout=180, cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL)
    out = result.stdout + result.stderr
    assert "Muster has no `crusoe` backend" in out, out
    assert "the project has no active fleet of the run's `backends` (crusoe)" in out, out
    run = wait_for_run("crusoe")
    assert run.status == "failed", (run.status, run.termination_message)
    assert "no fleet can hold" in run.termination_message and "`backends` (crusoe)" in run.termination_message
    assert result.returncode == 1, out
