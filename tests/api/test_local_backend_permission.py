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
