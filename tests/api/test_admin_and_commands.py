"""The Django admin, the management commands that hand out tokens, and the served API docs."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from events.models import Event
from instances.models import Fleet, Instance, InstanceGroup
from projects.models import ApiToken, Membership, Project
from runs.models import Job, Run
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_logged_in(client, django_user_model):
    superuser = django_user_model.objects.create_superuser("root", password="pw")
    client.force_login(superuser)
    return client


@pytest.fixture
def submitted_run(api):
    resp = api.post("/api/projects/main/runs/", {"configuration": {
        "type": "task", "name": "adm",
        "groups": [{"name": "router", "nodes": 1, "commands": ["echo r"]},
                   {"name": "workers", "nodes": 2, "commands": ["echo w"]}],
    }}, format="json")
    assert resp.status_code == 201, resp.json()
    return Run.objects.get(name="adm")


@pytest.fixture
def pod(project):
    fleet = Fleet.objects.create(project=project, name="tpu", backend="gcp", configuration={})
    group = InstanceGroup.objects.create(project=project, fleet=fleet, name="pod-b2", kind="tpu_pod", shape="v2-32",
                                         status="active", backend_data={"backend": "gcp"})
    for k in range(4):
        Instance.objects.create(project=project, fleet=fleet, group=group, index=k, name=f"pod-b2-{k}",
                                status="idle", backend="gcp", internal_ip=f"10.2.0.{k + 1}")
    return group


def _call(*args, **kwargs) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, **kwargs)
    return out.getvalue()


# ---- admin ------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "/admin/",
    "/admin/runs/run/",
    "/admin/instances/instance/",
    "/admin/instances/instancegroup/",
    "/admin/instances/fleet/",
    "/admin/events/event/",
    "/admin/projects/project/",
])
def test_admin_pages_load_for_a_superuser(admin_client_logged_in, submitted_run, pod, url):
    resp = admin_client_logged_in.get(url)
    assert resp.status_code == 200, url


def test_admin_changelists_list_the_rows(admin_client_logged_in, submitted_run, pod):
    assert "adm" in admin_client_logged_in.get("/admin/runs/run/").content.decode()
    assert "pod-b2-3" in admin_client_logged_in.get("/admin/instances/instance/").content.decode()
    assert "pod-b2" in admin_client_logged_in.get("/admin/instances/instancegroup/").content.decode()
    assert "submitted with 3 jobs" in admin_client_logged_in.get("/admin/events/event/").content.decode()


def test_admin_run_page_shows_its_jobs_inline(admin_client_logged_in, submitted_run):
    resp = admin_client_logged_in.get(f"/admin/runs/run/{submitted_run.pk}/change/")
    assert resp.status_code == 200
    inline = resp.context["inline_admin_formsets"]
    assert len(inline) == 1
    rows = [form.original for form in inline[0]]
    assert [(j.job_num, j.node_group_name, j.node_group_rank) for j in rows] == [
        (0, "router", 0), (1, "workers", 0), (2, "workers", 1)]
    html = resp.content.decode()
    assert "workers" in html and "router" in html


def test_admin_group_page_shows_its_hosts_in_worker_order(admin_client_logged_in, pod):
    resp = admin_client_logged_in.get(f"/admin/instances/instancegroup/{pod.pk}/change/")
    assert resp.status_code == 200
    rows = [form.original for form in resp.context["inline_admin_formsets"][0]]
    assert [i.index for i in rows] == [0, 1, 2, 3]


def test_the_admin_delete_whole_group_action_marks_the_pod_terminating(admin_client_logged_in, pod,
                                                                      django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        resp = admin_client_logged_in.post("/admin/instances/instancegroup/", {
            "action": "delete_whole_group", "_selected_action": [str(pod.pk)]}, follow=True)
    assert resp.status_code == 200
    pod.refresh_from_db()
    assert pod.status == "terminating"
    assert set(pod.instances.values_list("status", flat=True)) == {"terminating"}
    assert len(callbacks) == 1, "one backend delete for the whole pod, after commit"
    assert "deleting pod-b2" in [str(m) for m in resp.context["messages"]]


def test_the_admin_action_refuses_a_pod_that_runs_a_job(admin_client_logged_in, pod, submitted_run):
    Job.objects.filter(run=submitted_run, job_num=0).update(status="running", instance=pod.instances.get(index=0))
    resp = admin_client_logged_in.post("/admin/instances/instancegroup/", {
        "action": "delete_whole_group", "_selected_action": [str(pod.pk)]}, follow=True)
    assert resp.status_code == 200
    pod.refresh_from_db()
    assert pod.status == "active"
    assert any("stop the run first" in str(m) for m in resp.context["messages"])


def test_the_admin_stop_action_requests_a_stop(admin_client_logged_in, submitted_run):
    resp = admin_client_logged_in.post("/admin/runs/run/", {
        "action": "stop_runs", "_selected_action": [str(submitted_run.pk)]}, follow=True)
    assert resp.status_code == 200
    submitted_run.refresh_from_db()
    assert submitted_run.stop_requested == "stop"


def test_the_admin_refuses_a_weak_password(admin_client_logged_in, django_user_model):
    bob = django_user_model.objects.create_user("bob", password="a-long-enough-Passphrase-7")
    resp = admin_client_logged_in.post(f"/admin/auth/user/{bob.pk}/password/",
                                       {"password1": "12345678", "password2": "12345678", "usable_password": "true"})
    assert resp.status_code == 200, "the form comes back with errors instead of redirecting"
    assert "too common" in resp.content.decode()
    bob.refresh_from_db()
    assert bob.check_password("a-long-enough-Passphrase-7")


# ---- management commands ----------------------------------------------------------------------


def test_muster_token_makes_a_read_only_user_whose_token_works(db):
    out = _call("muster_token", "bob", "--project", "p2", "--role", "read-only")
    token = out.strip()
    assert re.fullmatch(r"mst_[A-Za-z0-9_-]{40,}", token), out
    bob = get_user_model().objects.get(username="bob")
    assert Membership.objects.get(user=bob, project__name="p2").role == "read-only"

    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/projects/p2/runs/").status_code == 200
    resp = client.post("/api/projects/p2/runs/", {"configuration": "type: task\ncommands: [echo]\n"}, format="json")
    assert resp.status_code == 403
    assert not Run.objects.exists()
    assert client.get("/api/projects/main/runs/").status_code == 404


def test_muster_token_again_prints_a_new_token_and_can_change_the_role(db):
    first = _call("muster_token", "bob", "--project", "p2", "--role", "read-only").strip()
    second = _call("muster_token", "bob", "--project", "p2", "--role", "user").strip()
    assert first != second, "only hashes are stored: the first key cannot be shown again"
    for key in (first, second):
        client = client_for(None)
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        assert client.get("/api/projects/p2/runs/").status_code == 200
    assert Membership.objects.get(user__username="bob", project__name="p2").role == "user"
    assert get_user_model().objects.filter(username="bob").count() == 1


def test_muster_bootstrap_creates_project_admin_fleet_and_a_working_token(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path  # it writes the generated admin password there
    out = _call("muster_bootstrap")
    token = re.search(r"^token: (mst_\S+)$", out, re.M)
    assert token, out
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser
    assert ApiToken.objects.filter(user=admin).count() == 1
    password = (tmp_path / "admin_password").read_text().strip()
    assert password in out
    assert (tmp_path / "admin_password").stat().st_mode & 0o777 == 0o600
    assert admin.check_password(password)
    assert Membership.objects.get(user=admin, project__name="main").role == "admin"
    fleet = Fleet.objects.get(project__name="main", name="local")
    assert fleet.backend == "local"
    assert fleet.instances.filter(status="idle").count() == 4

    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.group(1)}")
    rows = client.get("/api/projects/main/instances/?fleet=local").json()
    assert len(rows) == 4


def test_muster_bootstrap_twice_creates_nothing_new(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    first = _call("muster_bootstrap")

    def counts():
        return (Project.objects.count(), get_user_model().objects.count(), Membership.objects.count(),
                Fleet.objects.count(), Instance.objects.count(), ApiToken.objects.count(), Event.objects.count())

    before = counts()
    second = _call("muster_bootstrap")
    assert counts() == before
    key = re.search(r"^token: (\S+)$", first, re.M).group(1)
    assert key not in second, "a token is shown once, when it is made"
    assert "muster_token admin" in second
    assert first.split("token:")[0] == second.split("token:")[0], "the same project, user and password again"


# ---- OpenAPI schema and docs ------------------------------------------------------------------


def test_the_openapi_schema_lists_the_api(client):
    resp = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert resp.status_code == 200
    schema = resp.json()
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Muster API"
    paths = schema["paths"]
    for path in ("/api/projects/{project}/runs/", "/api/projects/{project}/runs/plan",
                 "/api/projects/{project}/fleets/", "/api/projects/{project}/instance-groups/{name}/",
                 "/api/projects/{project}/events/"):
        assert path in paths, path


def test_the_api_docs_page_loads_everything_from_this_server(client):
    resp = client.get("/api/docs/")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert "cdn.jsdelivr" not in html and "unpkg" not in html
    sources = re.findall(r"""<(?:script|link)[^>]+(?:src|href)=["']([^"']+)["']""", html)
    assert sources, "the page loads swagger-ui from somewhere"
    for src in sources:
        assert not re.match(r"^(https?:)?//", src), f"external asset {src}"
        asset = client.get(src)
        assert asset.status_code == 200, f"{src} is not served"


def test_muster_bootstrap_makes_no_local_fleet_where_the_local_backend_is_off(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.MUSTER = {**settings.MUSTER, "LOCAL_BACKEND": False}
    out = _call("muster_bootstrap")
    assert not Fleet.objects.exists() and not Instance.objects.exists()
    assert re.search(r"^token: mst_\S+$", out, re.M), out
