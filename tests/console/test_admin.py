"""The admin is for operators: it shows the state, names health in words, and edits nothing the
engine owns. Driven as an operator's browser drives it (GET the pages, POST the forms)."""

from __future__ import annotations

import pytest

from instances.models import Fleet, Instance
from runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client, django_user_model):
    django_user_model.objects.create_superuser("root", password="operator-pw-1")
    assert client.post("/admin/login/", {"username": "root", "password": "operator-pw-1",
                                         "next": "/admin/"}).status_code == 302
    return client


@pytest.fixture
def run(api):
    resp = api.post("/api/projects/main/runs/", {"configuration": {
        "type": "task", "name": "adm",
        "groups": [{"name": "router", "nodes": 1, "commands": ["echo r"]},
                   {"name": "workers", "nodes": 2, "commands": ["echo w"]}]}}, format="json")
    assert resp.status_code == 201, resp.content
    return Run.objects.get(name="adm")


@pytest.fixture
def hosts(project):
    fleet = Fleet.objects.create(project=project, name="gpus", backend="ssh", configuration={})
    good = Instance.objects.create(project=project, fleet=fleet, name="good-host", status="idle", backend="ssh",
                                   internal_ip="10.0.0.1", last_seen="2026-01-01T00:00:00Z",
                                   resources={"gpus": [{"name": "L40S", "memory_gb": 48}] * 2})
    lost = Instance.objects.create(project=project, fleet=fleet, name="lost-host", status="idle", backend="ssh",
                                   internal_ip="10.0.0.2", unreachable=True)
    return fleet, good, lost


def test_the_admin_carries_musters_name(operator):
    page = operator.get("/admin/").content.decode()
    assert "Muster administration" in page and "Django administration" not in page


def test_a_runs_internal_columns_cannot_be_edited(operator, run):
    page = operator.get(f"/admin/runs/run/{run.pk}/change/").content.decode()
    for column in ("derived_at", "status", "fleet", "stop_requested", "configuration", "lease_token"):
        assert f'name="{column}' not in page, column
    assert "router" in page and "workers" in page
    # a forged POST of the change form does not move the row either
    operator.post(f"/admin/runs/run/{run.pk}/change/", {"status": "done", "derived_at": "2020-01-01T00:00:00Z",
                                                        "jobs-TOTAL_FORMS": "0", "jobs-INITIAL_FORMS": "0"})
    run.refresh_from_db()
    assert run.status == "submitted" and run.derived_at is None


def test_an_active_run_cannot_be_deleted_from_the_admin(operator, run):
    assert operator.get(f"/admin/runs/run/{run.pk}/delete/").status_code == 403
    assert operator.post(f"/admin/runs/run/{run.pk}/delete/", {"post": "yes"}).status_code == 403
    changelist = operator.get("/admin/runs/run/").content.decode()
    assert 'value="delete_selected"' not in changelist
    operator.post("/admin/runs/run/", {"action": "delete_finished_runs", "_selected_action": [run.pk]})
    assert Run.objects.filter(pk=run.pk).exists()


def test_a_finished_run_can_be_deleted(operator, run):
    Run.objects.filter(pk=run.pk).update(status="done")
    operator.post("/admin/runs/run/", {"action": "delete_finished_runs", "_selected_action": [run.pk]})
    assert not Run.objects.filter(pk=run.pk).exists()


def test_instance_health_is_a_word_that_says_which_host_is_unreachable(operator, hosts):
    _, good, lost = hosts
    page = operator.get("/admin/instances/instance/").content.decode()
    rows = {line.split("</th>")[0]: line for line in page.split('<th class="field-name">')[1:]}
    good_row = next(r for k, r in rows.items() if "good-host" in k)
    lost_row = next(r for k, r in rows.items() if "lost-host" in k)
    assert '<td class="field-health">reachable</td>' in good_row
    assert '<td class="field-health">unreachable</td>' in lost_row
    assert "2x L40S 48GB" in good_row
    assert "icon-no.svg" not in page and "icon-yes.svg" not in page


def test_fleets_and_instances_are_read_only_and_cannot_be_added(operator, hosts):
    fleet, good, _ = hosts
    page = operator.get(f"/admin/instances/fleet/{fleet.pk}/change/").content.decode()
    for column in ("backend", "configuration", "network", "status"):
        assert f'name="{column}' not in page, column
    page = operator.get(f"/admin/instances/instance/{good.pk}/change/").content.decode()
    for column in ("status", "unreachable", "internal_ip", "backend_data", "resources"):
        assert f'name="{column}' not in page, column
    assert operator.get("/admin/instances/fleet/add/").status_code == 403
    assert operator.get("/admin/instances/instance/add/").status_code == 403
    assert operator.get(f"/admin/instances/instance/{good.pk}/delete/").status_code == 403
