"""Access matrix: every project endpoint and verb, for strangers, readers, users and anonymous callers."""

from __future__ import annotations

import pytest
from django.db import connection

from instances.models import Fleet, Instance, InstanceGroup
from projects.models import Membership, Project, Secret
from runs.services.submission import submit_run
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

P = "/api/projects/alpha"
READS = [
    f"{P}/", f"{P}/members/", f"{P}/secrets/", f"{P}/events/", f"{P}/runs/", f"{P}/runs/r1/",
    f"{P}/runs/r1/logs?job=0", f"{P}/runs/r1/metrics", f"{P}/fleets/", f"{P}/fleets/f1/", f"{P}/instances/", f"{P}/instance-groups/",
    f"{P}/instance-groups/g1/",
]
RUN_BODY = {"configuration": "type: task\ncommands: [echo hi]\n"}
WRITES = [
    ("post", f"{P}/members/", {"username": "x", "role": "user"}),
    ("post", f"{P}/secrets/", {"name": "NEW", "value": "v"}),
    ("delete", f"{P}/secrets/S1/", None),
    ("post", f"{P}/runs/plan", RUN_BODY),
    ("post", f"{P}/runs/", RUN_BODY),
    ("post", f"{P}/runs/r1/stop", {"abort": False}),
    ("delete", f"{P}/runs/r1/", None),
    ("post", f"{P}/fleets/", {"configuration": "type: fleet\nname: f2\nbackends: [local]\nnodes: 1\n"}),
    ("delete", f"{P}/fleets/f1/", None),
    ("delete", f"{P}/instance-groups/g1/", None),
]
ADMIN_ONLY = [w for w in WRITES if "/members/" in w[1] or "/secrets/" in w[1]]
PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ-plaintext\n"
SECRET_VALUE = "s3cr3t-hf-token-value"


@pytest.fixture
def world(django_user_model, django_capture_on_commit_callbacks):
    projects = {name: Project.objects.create(name=name) for name in ("alpha", "beta", "gamma")}
    users = {}
    for role in ("admin", "user", "read-only"):
        user = django_user_model.objects.create_user(username=f"alpha-{role}")
        Membership.objects.create(project=projects["alpha"], user=user, role=role)
        users[role] = user
    users["stranger"] = django_user_model.objects.create_user(username="beta-admin")
    Membership.objects.create(project=projects["beta"], user=users["stranger"], role="admin")
    alpha = projects["alpha"]
    secret = Secret(project=alpha, name="S1")
    secret.value = SECRET_VALUE
    secret.save()
    fleet = Fleet(project=alpha, name="f1", backend="ssh", placement="cluster",
                  configuration={"type": "fleet", "name": "f1"})
    fleet.private_key = PRIVATE_KEY
    fleet.save()
    group = InstanceGroup.objects.create(project=alpha, fleet=fleet, name="g1", kind="cluster")
    Instance.objects.create(project=alpha, fleet=fleet, group=group, name="g1-0", backend="ssh", status="idle",
                            internal_ip="10.9.9.9")
    with django_capture_on_commit_callbacks():
        submit_run(alpha, users["admin"], {"configuration": "type: task\nname: r1\nenv: [S1]\ncommands: [echo]\n"})
    return users


def _call(client, method, path, body=None):
    return getattr(client, method)(path, body, format="json") if body is not None else getattr(client, method)(path)


@pytest.mark.parametrize("path", READS)
def test_reads_are_404_for_strangers_401_for_anonymous_and_200_for_members(world, path):
    assert client_for(world["stranger"]).get(path).status_code == 404
    assert client_for(None).get(path).status_code == 401
    for role in ("admin", "user", "read-only"):
        assert client_for(world[role]).get(path).status_code == 200, (role, path)


@pytest.mark.parametrize("method,path,body", WRITES)
def test_writes_are_404_for_strangers_401_for_anonymous_and_403_for_readers(world, method, path, body):
    assert _call(client_for(world["stranger"]), method, path, body).status_code == 404
    assert _call(client_for(None), method, path, body).status_code == 401
    assert _call(client_for(world["read-only"]), method, path, body).status_code == 403


@pytest.mark.parametrize("method,path,body", ADMIN_ONLY)
def test_members_and_secrets_are_changed_by_admins_only(world, method, path, body):
    assert _call(client_for(world["user"]), method, path, body).status_code == 403


def test_projects_list_shows_only_the_callers_projects(world):
    names = [p["name"] for p in client_for(world["stranger"]).get("/api/projects/").json()]
    assert names == ["beta"]


def tables_holding(*markers: str) -> list[str]:
    """The tables with a row whose text holds one of `markers` (one entry a row)."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')
            for row in cursor.fetchall():
                text = " ".join(str(v) for v in row)
                if any(marker in text for marker in markers):
                    found.append(table)
    return found


def test_the_database_never_holds_a_private_key_or_secret_value_in_plaintext(world):
    assert tables_holding(SECRET_VALUE, "plaintext") == []
