"""Members: adding a username tells nothing about which accounts exist, and whoever is added can see
the project and leave it. Two users with projects of their own, through the REST API."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from tests.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def mallory(make_user):
    """Any user: creates a project of her own through the API, so she is its admin."""
    client = client_for(make_user("mallory", project=None))
    assert client.post("/api/projects/", {"name": "probe"}, format="json").status_code == 201
    return client


def _add(client, username: str, role: str = "admin"):
    return client.post("/api/projects/probe/members/", {"username": username, "role": role}, format="json")


def test_adding_an_existing_and_an_unknown_username_answer_alike(mallory, make_user):
    make_user("bob", project="bobs")
    known, unknown = _add(mallory, "bob"), _add(mallory, "nobody-here")
    assert (known.status_code, unknown.status_code) == (201, 201), (known.content, unknown.content)
    assert known.json() == {"username": "bob", "role": "admin"}
    assert unknown.json() == {"username": "nobody-here", "role": "admin"}
    listed = mallory.get("/api/projects/probe/members/").json()
    assert listed == [{"username": "bob", "role": "admin"}, {"username": "mallory", "role": "admin"},
                      {"username": "nobody-here", "role": "admin"}]
    assert mallory.get("/api/projects/probe/members/", {"role": "admin"}).json() == listed
    assert _add(mallory, "ghost", role="read-only").status_code == 201
    assert mallory.get("/api/projects/probe/members/", {"role": "read-only"}).json() == [
        {"username": "ghost", "role": "read-only"}], "the role filter applies to names without an account too"


def test_a_username_no_account_could_have_is_refused_naming_the_field(mallory):
    resp = _add(mallory, "not a name!")
    assert resp.status_code == 400
    assert [e["loc"] for e in resp.json()["errors"]] == [["username"]]
    assert [m["username"] for m in mallory.get("/api/projects/probe/members/").json()] == ["mallory"]


def test_a_user_added_to_a_project_sees_it_and_can_leave(mallory, make_user):
    bob = client_for(make_user("bob", project="bobs"))
    assert _add(mallory, "bob", role="user").status_code == 201
    assert bob.get("/api/memberships/").json() == [{"project": "bobs", "role": "admin"},
                                                    {"project": "probe", "role": "user"}]
    assert "probe" in [p["name"] for p in bob.get("/api/projects/").json()]

    assert bob.delete("/api/memberships/probe/").status_code == 204
    assert bob.get("/api/memberships/").json() == [{"project": "bobs", "role": "admin"}]
    assert bob.get("/api/projects/probe/").status_code == 404
    assert [m["username"] for m in mallory.get("/api/projects/probe/members/").json()] == ["mallory"]
    assert bob.get("/api/projects/bobs/").status_code == 200, "his own project is untouched"


def test_a_superuser_added_to_a_project_sees_the_membership_and_can_leave(mallory, django_user_model):
    root = client_for(django_user_model.objects.create_superuser(username="root", password=None))
    assert _add(mallory, "root").status_code == 201
    assert root.get("/api/memberships/").json() == [{"project": "probe", "role": "admin"}]
    assert root.delete("/api/memberships/probe/").status_code == 204
    assert root.get("/api/memberships/").json() == []


def test_leaving_a_project_one_is_not_in_is_a_404_and_changes_nothing(mallory, make_user):
    bob = client_for(make_user("bob", project="bobs"))
    assert bob.delete("/api/memberships/probe/").status_code == 404
    assert bob.delete("/api/memberships/no-such-project/").status_code == 404
    assert [m["username"] for m in mallory.get("/api/projects/probe/members/").json()] == ["mallory"]


def test_an_account_created_later_finds_the_membership_waiting(mallory, capsys):
    assert _add(mallory, "newhire", role="read-only").status_code == 201
    call_command("muster_token", "newhire")
    token = capsys.readouterr().out.strip().splitlines()[-1]
    from rest_framework.test import APIClient

    newhire = APIClient()
    newhire.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert newhire.get("/api/memberships/").json() == [{"project": "probe", "role": "read-only"}]
    assert mallory.get("/api/projects/probe/members/").json() == [
        {"username": "mallory", "role": "admin"}, {"username": "newhire", "role": "read-only"}]
    assert newhire.post("/api/projects/probe/secrets/", {"name": "X", "value": "v"},
                        format="json").status_code == 403, "with the role it was given"
