"""The console's pages through HTTP as a browser sends them: log in at /login/, then read."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import client_for

pytestmark = pytest.mark.django_db

CONF = "type: task\nname: {name}\nnodes: 2\ncommands: [echo hi]\n"
THREE = """type: task
name: three
startup_order: workers-first
groups:
  - {name: router, nodes: 1, commands: [echo r]}
  - {name: prefill, nodes: 2, commands: [echo p]}
  - {name: decode, nodes: 1, commands: [echo d]}
"""


def _user(make_user, name, project="main", role="admin"):
    user = make_user(name, project, role)
    user.set_password("pw-" + name + "-long-enough")
    user.save()
    return user


def _browser(user) -> Client:
    browser = Client(enforce_csrf_checks=False)
    response = browser.post("/login/", {"username": user.username, "password": "pw-" + user.username + "-long-enough"})
    assert response.status_code == 302, response.content[:500]
    return browser


def _submit(user, text, project="main"):
    response = client_for(user).post(f"/api/projects/{project}/runs/", {"configuration": text}, format="json")
    assert response.status_code == 201, response.content


def test_the_root_url_asks_for_a_login_and_then_lists_the_users_runs(make_user):
    alice = _user(make_user, "alice")
    _submit(alice, CONF.format(name="first"))
    anonymous = Client().get("/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    page = _browser(alice).get("/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "/projects/main/runs/first/" in body and "submitted" in body


def test_a_run_of_another_project_is_404_to_a_non_member_and_missing_from_their_list(make_user):
    alice = _user(make_user, "alice")
    bob = _user(make_user, "bob", project="other")
    _submit(alice, CONF.format(name="secret-run"))
    browser = _browser(bob)
    assert "secret-run" not in browser.get("/").content.decode()
    for path in ("/projects/main/runs/secret-run/", "/projects/main/runs/secret-run/status",
                 "/projects/main/runs/secret-run/log?job=0", "/projects/main/fleets/"):
        assert browser.get(path).status_code == 404, path
    assert browser.post("/projects/main/runs/secret-run/stop").status_code == 404
    assert _browser(alice).get("/projects/main/runs/secret-run/").status_code == 200


def test_the_run_page_draws_groups_ranks_and_start_order_and_masks_secrets(make_user):
    alice = _user(make_user, "alice")
    client_for(alice).post("/api/projects/main/secrets/", {"name": "TOKEN", "value": "s3cr3t-value"}, format="json")
    _submit(alice, THREE.replace("startup_order", "env:\n  - TOKEN=${{ secrets.TOKEN }}\nstartup_order"))
    body = _browser(alice).get("/projects/main/runs/three/").content.decode()
    assert body.count('class="group"') == 3
    for name in ("router", "prefill", "decode"):
        assert f'data-group="{name}"' in body
    assert "rank 1 · global 2" in body  # prefill's second node
    assert "starts 2nd (after the workers)" in body and "starts 1st" in body
    assert "s3cr3t-value" not in body
    from runs.models import Run

    stored = Run.objects.get(name="three").configuration
    assert stored["secret_env"] and stored["secret_env"] not in body and "secret_env" not in body
    assert "TOKEN" in body  # the env entry itself is shown, as the API shows it
    assert 'id="stop"' in body


@pytest.mark.parametrize("path", ["/projects/ma%00in/runs/first/", "/projects/main/runs/fi%00rst/",
                                  "/projects/main/runs/fi%00rst/status", "/projects/main/runs/fi%00rst/log?job=0",
                                  "/projects/main/runs/fi%00rst/log.txt?job=0", "/projects/ma%00in/fleets/"])
def test_a_nul_in_a_name_of_a_console_url_is_a_404_not_a_500(make_user, path):
    """PostgreSQL refuses a NUL in a query: the page was a 500 (the API's paths were already 404s)."""
    alice = _user(make_user, "alice")
    _submit(alice, CONF.format(name="first"))
    assert _browser(alice).get(path).status_code == 404


def test_stop_is_offered_and_allowed_only_to_roles_that_may_stop(make_user):
    alice = _user(make_user, "alice")
    reader = _user(make_user, "reader", role="read-only")
    _submit(alice, CONF.format(name="r1"))
    browser = _browser(reader)
    page = browser.get("/projects/main/runs/r1/").content.decode()
    assert 'id="stop"' not in page
    assert browser.post("/projects/main/runs/r1/stop").status_code == 403
    assert client_for(alice).get("/api/projects/main/runs/r1/").json()["status"] != "terminating"
    assert _browser(alice).post("/projects/main/runs/r1/stop").status_code == 302
    from runs.models import Run

    assert Run.objects.get(name="r1").stop_requested == "stop"


def test_the_log_endpoint_refuses_bad_numbers(make_user):
    alice = _user(make_user, "alice")
    _submit(alice, CONF.format(name="r2"))
    browser = _browser(alice)
    assert browser.get("/projects/main/runs/r2/log?job=x").status_code == 400
    assert browser.get("/projects/main/runs/r2/log?job=0&start=-1").status_code == 400
    assert browser.get("/projects/main/runs/r2/log?job=9").status_code == 404
    assert browser.get("/projects/main/runs/r2/log?job=1").json()["text"] == ""


def test_a_console_reader_over_the_user_rate_gets_a_429_and_the_api_counts_against_the_same_rate(
        make_user, settings):
    from django.core.cache import cache

    alice, bob = _user(make_user, "alice"), _user(make_user, "bob", role="read-only")
    _submit(alice, CONF.format(name="r3"))
    cache.clear()
    settings.MUSTER = {**settings.MUSTER, "THROTTLE_USER": "3/min"}
    try:
        browser = _browser(bob)
        assert [browser.get("/projects/main/runs/r3/log?job=0").status_code for _ in range(2)] == [200, 200]
        assert client_for(bob).get("/api/projects/main/runs/r3/logs?job=0").status_code == 200
        over = browser.get("/projects/main/runs/r3/log?job=0")
        assert over.status_code == 429
        assert int(over.headers["Retry-After"]) > 0 and over.json()["retry_after"] > 0
        assert "MUSTER_THROTTLE_USER" in over.json()["detail"]
        assert _browser(alice).get("/projects/main/runs/r3/log?job=0").status_code == 200, "counted per reader"
    finally:
        cache.clear()


def test_the_fleets_page_names_the_same_job_on_a_host_as_the_api(make_user):
    """A job being stopped is still on its host, and a job not yet placed on none: the console's
    fleets page and `muster instances` (the API) say the same of every host."""
    from instances.models import Instance
    from instances.services.fleets import create_local_fleet
    from projects.models import Project
    from runs.choices import JobStatus
    from runs.models import Job, Run

    alice = _user(make_user, "alice")
    create_local_fleet(Project.objects.get(name="main"), "box", 2)
    _submit(alice, CONF.format(name="held"))
    first, second = Instance.objects.order_by("name")
    stopping, waiting = Job.objects.filter(run=Run.objects.get(name="held")).order_by("job_num")
    Job.objects.filter(pk=stopping.pk).update(status=JobStatus.TERMINATING, instance=first)
    Job.objects.filter(pk=waiting.pk).update(status=JobStatus.SUBMITTED, instance=second)

    api = {row["name"]: row["job"] for row in client_for(alice).get("/api/projects/main/instances/").json()}
    assert api == {first.name: "held/0", second.name: None}
    rows = {}
    for row in _browser(alice).get("/projects/main/fleets/").content.decode().split("<tr")[1:]:
        for inst in (first, second):
            if f">{inst.name}<" in row:
                rows[inst.name] = "held/" in row
    assert rows == {first.name: True, second.name: False}


def test_every_console_page_has_a_content_security_policy_without_inline_script(make_user):
    alice = _user(make_user, "alice")
    _submit(alice, CONF.format(name="first"))
    anonymous = Client()
    browser = _browser(alice)
    pages = [anonymous.get("/login/"), browser.get("/"), browser.get("/projects/main/runs/first/"),
             browser.get("/projects/main/runs/first/status"), browser.get("/projects/main/fleets/")]
    for page in pages:
        assert page.status_code == 200, page.request["PATH_INFO"]
        policy = dict(part.strip().split(" ", 1) for part in page["Content-Security-Policy"].split(";"))
        assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
        assert policy["object-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
        assert page["X-Content-Type-Options"] == "nosniff"
        assert page["Referrer-Policy"] == "same-origin"


def test_no_console_template_has_inline_script_style_or_event_handlers():
    import re
    from pathlib import Path

    import console

    templates = sorted((Path(console.__file__).parent / "templates").rglob("*.html"))
    assert templates
    for path in templates:
        text = path.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), f"{path.name}: an inline <script>"
        assert not re.search(r"<style\b|\sstyle=", text), f"{path.name}: inline style"
        assert not re.search(r"\son[a-z]+\s*=", text), f"{path.name}: an inline event handler"
