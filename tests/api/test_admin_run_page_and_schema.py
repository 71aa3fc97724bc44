"""Over HTTP (a live server, a signed-in admin session): the admin's run page shows the submitted
text as written (indentation kept) and offers nothing to save, and /api/schema/ groups operations by
resource with component names that read as one word each."""

from __future__ import annotations

import json
import re
import urllib.request
from html import unescape

import pytest

from runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

TEXT = """type: task
name: indented
groups:
  - name: router
    nodes: 1
    commands:
      - echo "router"
  - name: workers
    nodes: 2
    commands:
      - |
        for i in 1 2; do
            echo "worker $i"
        done
"""


def _get(url: str, cookie: str = "") -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Cookie": cookie, "Accept": "application/json, text/html"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status, answer.read().decode()


@pytest.fixture
def session(live_server, client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="a-password-for-the-admin-1")
    client.force_login(admin)
    return f"sessionid={client.cookies['sessionid'].value}"


def test_the_admin_run_page_keeps_the_texts_indentation_and_has_no_save_button(live_server, api, session):
    submitted = api.post("/api/projects/main/runs/", {"configuration": TEXT}, format="json")
    assert submitted.status_code == 201, submitted.json()
    run = Run.objects.get(name="indented")
    status, page = _get(f"{live_server.url}/admin/runs/run/{run.pk}/change/", session)
    assert status == 200
    shown = re.search(r"<label>Submitted text:</label>\s*<div class=\"readonly\">(.*?)</div>", page, re.S)
    assert shown, page
    pre = re.fullmatch(r"\s*<pre[^>]*>(.*?)</pre>\s*", shown.group(1), re.S)
    assert pre, shown.group(1)
    assert unescape(pre.group(1)) == TEXT
    # read-only: no Save, Save and continue or Save and add another, and no form fields to edit
    assert not re.search(r'<input type="submit"[^>]*name="_(save|continue|addanother)"', page), page
    assert not re.search(r'<(input|textarea|select)[^>]*name="(name|status|submitted_text)"', page)


def test_the_schema_tags_operations_by_resource_and_names_request_bodies_once(live_server):
    status, body = _get(f"{live_server.url}/api/schema/?format=json")
    assert status == 200
    schema = json.loads(body)
    tags = {}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if method != "parameters":
                tags[f"{method.upper()} {path}"] = operation["tags"]
    assert tags["POST /api/projects/{project}/runs/{name}/stop"] == ["runs"]
    assert tags["GET /api/projects/{project}/runs/"] == ["runs"]
    assert tags["GET /api/projects/{project}/fleets/{name}/"] == ["fleets"]
    assert tags["GET /api/projects/{project}/instances/"] == ["instances"]
    assert tags["GET /api/projects/{project}/events/"] == ["events"]
    assert tags["GET /api/projects/{project}/"] == ["projects"]
    assert tags["GET /api/projects/"] == ["projects"]
    assert all(len(t) == 1 for t in tags.values())
    assert len({t[0] for t in tags.values()}) >= 6, tags
    names = set(schema["components"]["schemas"])
    assert not [n for n in names if re.search(r"(Request){2}|(List){2}", n)], sorted(names)
    assert {"RunRequest", "FleetRequest", "StopRequest", "Run", "Fleet"} <= names, sorted(names)
    run_plan = schema["paths"]["/api/projects/{project}/runs/plan"]["post"]["requestBody"]
    assert run_plan["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/RunRequest"
