"""The local backend runs jobs as the control plane's own user: who may create a local fleet."""

from __future__ import annotations

import pytest

from instances.models import Fleet, Instance
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

FLEETS = "/api/projects/main/fleets/"
LOCAL = "type: fleet\nname: shell\nbackends: [local]\nnodes: 1\n"


def post_fleet(client, configuration=LOCAL):
    return client.post(FLEETS, {"configuration": configuration}, format="json")


@pytest.mark.parametrize("role", ["admin", "user"])
def test_a_project_member_who_is_not_a_superuser_gets_a_403_naming_backends(make_user, role):
    resp = post_fleet(client_for(make_user("mallory", role=role)))
    assert resp.status_code == 403, resp.content
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["backends"]
    assert "superuser" in error["msg"]
    assert not Fleet.objects.exists() and not Instance.objects.exists(), "nothing half-created"


def test_a_superuser_creates_one(superuser_api):
    resp = post_fleet(superuser_api)
    assert resp.status_code == 201, resp.json()
    assert Instance.objects.filter(fleet__name="shell").count() == 1


def test_a_local_fleet_over_the_cap_is_a_400_on_nodes(superuser_api, settings):
    settings.MUSTER = {**settings.MUSTER, "LOCAL_FLEET_MAX": 3}
    resp = post_fleet(superuser_api, "type: fleet\nname: big\nbackends: [local]\nnodes: 4\n")
    assert resp.status_code == 400
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["nodes"] and "3" in error["msg"]
    assert not Fleet.objects.exists()


def test_with_the_backend_off_even_a_superuser_is_refused(superuser_api, settings):
    settings.MUSTER = {**settings.MUSTER, "LOCAL_BACKEND": False}
    resp = post_fleet(superuser_api)
    assert resp.status_code == 403
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["backends"] and "MUSTER_LOCAL_BACKEND" in error["msg"]
    assert not Fleet.objects.exists()


TASK = "type: task\nname: {name}\ncommands: [id]\n"


@pytest.fixture
def bootstrapped(settings, make_user):
    """`make run`'s project main (its local fleet, its superuser admin) with a `user` member, and
    the server's default: local fleets take superusers' runs only."""
    from django.core.management import call_command

    settings.MUSTER = {**settings.MUSTER, "LOCAL_FLEET_MEMBERS": False}
    call_command("muster_bootstrap", stdout=open("/dev/null", "w"))
    return make_user("mallory", role="user")


def test_a_user_member_of_main_cannot_run_jobs_on_the_bootstrap_local_fleet(bootstrapped):
    from runs.models import Run

    member = client_for(bootstrapped)
    resp = member.post("/api/projects/main/runs/", {"configuration": TASK.format(name="shell")}, format="json")
    assert resp.status_code == 403, resp.content
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["fleets"] and "superuser" in error["msg"] and "MUSTER_LOCAL_FLEET_MEMBERS" in error["msg"]
    named = member.post("/api/projects/main/runs/", {"configuration": TASK.format(name="named") + "fleets: [local]\n"},
                        format="json")
    assert named.status_code == 403
    assert not Run.objects.exists(), "nothing half-created"
    plan = member.post("/api/projects/main/runs/plan", {"configuration": TASK.format(name="shell")}, format="json")
    assert plan.status_code == 200
    assert plan.json()["capacity"]["fits"] is False and plan.json()["capacity"]["fleet"] is None
    assert "superusers" in plan.json()["capacity"]["reasons"][0]


def test_the_superuser_still_runs_on_it_and_the_operator_can_open_it_to_members(bootstrapped, settings,
                                                                               django_user_model):
    admin = client_for(django_user_model.objects.get(username="admin"))
    plan = admin.post("/api/projects/main/runs/plan", {"configuration": TASK.format(name="a")}, format="json")
    assert plan.json()["capacity"]["fleet"] == "local"
    assert admin.post("/api/projects/main/runs/", {"configuration": TASK.format(name="a")},
                      format="json").status_code == 201
    settings.MUSTER = {**settings.MUSTER, "LOCAL_FLEET_MEMBERS": True}
    assert client_for(bootstrapped).post("/api/projects/main/runs/", {"configuration": TASK.format(name="b")},
                                         format="json").status_code == 201


def test_local_fleets_take_only_superusers_runs_by_default(tmp_path):
    from tests.test_settings_and_compose import python

    out = python("from muster import settings as s; print(s.MUSTER['LOCAL_FLEET_MEMBERS'])", tmp_path / "data")
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.django_db(transaction=True)
def test_a_members_run_is_never_placed_on_the_local_fleet_by_the_engine(bootstrapped, celery_worker, fast_limits,
                                                                        settings, tmp_path):
    """With another fleet in the project the member's run is accepted; the worker then places it
    on neither the full SSH fleet nor the local one next to it, and its command never runs."""
    from instances.models import FleetBackend, Placement
    from projects.models import Project
    from runs.choices import JobReason, RunStatus
    from tests.engine.helpers import wait_for_run

    settings.MUSTER = {**settings.MUSTER, "LOCAL_FLEET_MEMBERS": False}
    Fleet.objects.create(project=Project.objects.get(name="main"), name="gpu-hosts", backend=FleetBackend.SSH,
                         placement=Placement.CLUSTER)
    proof = tmp_path / "ran-on-the-control-plane"
    conf = f"type: task\nname: escape\ncommands: [touch {proof}]\n"
    resp = client_for(bootstrapped).post("/api/projects/main/runs/", {"configuration": conf}, format="json")
    assert resp.status_code == 201, resp.content
    run = wait_for_run("escape", timeout=60)
    assert run.status == RunStatus.FAILED and run.fleet is None
    (job,) = run.jobs.all()
    assert job.termination_reason == JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY and job.instance_id is None
    assert "superusers" in job.termination_message or "gpu-hosts" in job.termination_message, job.termination_message
    assert not proof.exists()
