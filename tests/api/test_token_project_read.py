"""A project-scoped API request with a token reads the token's user, the project its URL names and
the user's role there in one statement (projects.services.tokens.user_and_project_for_key), and
every answer about who may do what stays the one the two reads gave."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from projects.models import ApiToken, Membership, Project
from projects.services import tokens
from tests.conftest import client_for, token_for

pytestmark = pytest.mark.django_db


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_a_project_scoped_request_reads_user_and_project_in_one_statement(make_user):
    api = client_for(make_user("alice", "main", "user"))
    with CaptureQueriesContext(connection) as q:
        assert api.get("/api/projects/main/runs/").status_code == 200
    assert '"projects_apitoken"' in q[0]["sql"] and '"projects_project" p ON p."name"' in q[0]["sql"], q[0]["sql"]
    assert not [s["sql"] for s in q[1:] if "caller_role" in s["sql"] or "projects_membership" in s["sql"]], \
        "no second read of the project or the caller's role"
    with CaptureQueriesContext(connection) as q:  # a URL with no project: the user alone
        assert api.get("/api/projects/").status_code == 200
    assert '"projects_project" p ON' not in q[0]["sql"]


def test_the_user_and_the_project_read_together_are_the_orms_rows(make_user):
    user = make_user("alice", "main", "read-only")
    Project.objects.filter(name="main").update(log_quota=12345)
    key = token_for(user)
    read_user, read_project = tokens.user_and_project_for_key(key, "main")
    assert _fields(read_user) == _fields(get_user_model().objects.get(pk=user.pk))
    assert _fields(read_project) == _fields(Project.objects.get(name="main"))
    assert read_project.caller_role == "read-only"
    assert not read_user._state.adding and not read_project._state.adding
    assert tokens.user_and_project_for_key(key, "nowhere")[0] == read_user
    assert tokens.user_and_project_for_key(key, "nowhere")[1] is None


@pytest.mark.parametrize(("role", "method", "status"), [
    ("admin", "post", 200), ("user", "post", 200), ("read-only", "get", 200), ("read-only", "post", 403),
    (None, "get", 404), (None, "post", 404),
])
def test_what_a_caller_may_do_in_a_project(make_user, role, method, status):
    make_user("owner", "main", "admin")
    user = make_user("caller", "main" if role else "elsewhere", role or "admin")
    api = client_for(user)
    body = {"configuration": "type: task\ncommands: [echo]\n"}
    got = api.get("/api/projects/main/runs/") if method == "get" else api.post(
        "/api/projects/main/runs/plan", body, format="json")
    assert got.status_code == status, got.content
    if status == 404:  # as for a project that does not exist: never say it does
        missing = api.get("/api/projects/absent/runs/") if method == "get" else api.post(
            "/api/projects/absent/runs/plan", body, format="json")
        assert missing.status_code == 404
        assert got.json()["errors"][0]["msg"].replace("main", "X") == \
            missing.json()["errors"][0]["msg"].replace("absent", "X")
    if status == 403:
        assert "read-only" in got.json()["errors"][0]["msg"]


def test_a_superuser_may_use_a_project_it_is_not_a_member_of(make_user, django_user_model):
    make_user("owner", "main", "admin")
    root = django_user_model.objects.create_superuser(username="root", password=None)
    assert client_for(root).get("/api/projects/main/runs/").status_code == 200


@pytest.mark.parametrize("spoil", ["expired", "deactivated", "unknown"])
def test_a_spoilt_token_is_refused_before_any_project_is_looked_at(make_user, spoil):
    user = make_user("alice", "main", "admin")
    key = token_for(user)
    if spoil == "expired":
        ApiToken.objects.filter(user=user).update(expires=timezone.now() - timedelta(seconds=1))
    elif spoil == "deactivated":
        get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    else:
        key = key[:-4] + "abcd"
    api = client_for(None)
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    for path in ("/api/projects/main/runs/", "/api/projects/absent/runs/"):
        got = api.get(path)
        assert got.status_code == 401, (path, got.content)


def test_another_tenants_project_of_the_name_a_member_knows_is_not_found(make_user):
    make_user("bob", "team-b", "admin")
    alice = make_user("alice", "team-a", "admin")
    api = client_for(alice)
    assert api.get("/api/projects/team-a/runs/").status_code == 200
    assert api.get("/api/projects/team-b/runs/").status_code == 404
    assert not Membership.objects.filter(user=alice, project__name="team-b").exists()


def test_dstacks_layer_reads_the_project_with_the_token_too(make_user):
    from tests.dstack_cli.bodies import dstack_client, one_detail, post

    dstack = dstack_client(make_user("alice", "main", "user"))
    with CaptureQueriesContext(connection) as q:
        assert post(dstack, "project/main/fleets/list", {}).status_code == 200
    assert '"projects_project" p ON p."name"' in q[0]["sql"], q[0]["sql"]
    assert not [s["sql"] for s in q[1:] if "caller_role" in s["sql"] or "projects_membership" in s["sql"]]
    stranger = dstack_client(make_user("mallory", "other", "admin"))
    # dstack's answer for a project that is not there, the same as for one that does not exist
    assert one_detail(post(stranger, "project/main/fleets/list", {}), 400, "resource_not_exists") == one_detail(
        post(stranger, "project/absent/fleets/list", {}), 400, "resource_not_exists").replace("absent", "main")
