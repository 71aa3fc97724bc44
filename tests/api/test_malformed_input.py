"""Malformed or hostile input gets a 4xx in the errors shape, never a 500 or an HTML page."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from tests.conftest import token_for

pytestmark = pytest.mark.django_db

PLAN = "/api/projects/main/runs/plan"


@pytest.fixture
def raw(make_user):
    """A client that sends bytes as they are (no encoding by the test client) and raises nothing."""
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Token {token_for(make_user('alice'))}")
    return client


def assert_errors(resp, code: int, loc: list) -> list[dict]:
    assert resp.status_code == code, resp.content[:500]
    assert resp["Content-Type"].startswith("application/json"), resp["Content-Type"]
    errors = resp.json()["errors"]
    assert errors and all(set(e) == {"loc", "msg"} for e in errors), errors
    assert errors[0]["loc"] == loc, errors
    return errors


def test_deeply_nested_json_is_a_400_at_the_body(raw):
    body = '{"configuration": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (error,) = assert_errors(raw.post(PLAN, body, content_type="application/json"), 400, [])
    assert "nested" in error["msg"]


def test_json_nested_a_little_less_deep_is_refused_too(raw):
    # deep enough to pass json.loads but to exhaust the stack of whatever walks it next
    body = '{"configuration": {"type": "task", "commands": ["echo"], "env": ' + "[" * 500 + "]" * 500 + "}}"
    assert_errors(raw.post(PLAN, body, content_type="application/json"), 400, [])


def test_a_yaml_integer_over_4300_digits_is_a_400(raw):
    conf = "type: task\nnodes: " + "9" * 5000 + "\ncommands: [echo]\n"
    errors = assert_errors(raw.post(PLAN, json.dumps({"configuration": conf}), content_type="application/json"),
                           400, ["configuration"])
    assert "line 2" in errors[0]["msg"] and "too large" in errors[0]["msg"], errors


@pytest.mark.parametrize("body, loc", [
    ({"configuration": {"type": "task", "commands": ["echo \x00"]}}, ["configuration", "commands", 0]),
    ({"configuration": "type: task\ncommands: [echo]\n", "env": {"A": "x\x00"}}, ["env", "A"]),
    ({"configuration": "type: task\ncommands: [\"echo \\0\"]\n"}, ["commands", 0]),
    ({"configuration": "type: task\nenv: [\"A=\\x00\"]\ncommands: [echo]\n"}, ["env", 0]),
])
def test_a_nul_character_in_a_body_is_a_400_naming_where(raw, body, loc):
    """PostgreSQL cannot store a NUL (U+0000): it was a 500 once the value reached a write."""
    from runs.models import Run

    for path in (PLAN, "/api/projects/main/runs/"):
        (error,) = assert_errors(raw.post(path, json.dumps(body), content_type="application/json"), 400, loc)
        assert "NUL" in error["msg"], error
    assert not Run.objects.exists()


@pytest.mark.parametrize("path", ["/api/projects/ma%00in/runs/", "/api/projects/main/runs/r%00/",
                                  "/api/projects/main/fleets/f%00/", "/api/projects/main/instance-groups/g%00/"])
def test_a_nul_in_a_name_of_the_path_is_a_404(raw, path):
    resp = raw.get(path)
    assert resp.status_code == 404 and resp["Content-Type"].startswith("application/json"), resp.content[:300]


@pytest.mark.parametrize("param,value", [("start", 10**30), ("job", 10**30), ("start", -1), ("job", "²")])
def test_a_huge_or_odd_number_on_the_logs_endpoint_is_a_400_naming_it(raw, param, value):
    body = json.dumps({"configuration": "type: task\nname: r1\ncommands: [echo]\n"})
    assert raw.post("/api/projects/main/runs/", body, content_type="application/json").status_code == 201
    resp = raw.get("/api/projects/main/runs/r1/logs", {param: value})
    assert_errors(resp, 400, [param])


def test_a_body_over_the_size_limit_is_a_413_in_the_errors_shape(raw, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"configuration": "type: task\ncommands: [echo]\n" + "# padding\n" * 200})
    (error,) = assert_errors(raw.post(PLAN, body, content_type="application/json"), 413, [])
    assert "1000" in error["msg"]


@pytest.mark.django_db(transaction=True)
def test_a_huge_start_on_a_finished_jobs_stored_log_is_a_400(fast_limits, celery_worker, api):
    from engine.groups import terminate_fleet_instances
    from tests.engine.helpers import local_project_fleet, wait_for_run

    fleet = local_project_fleet(size=1)
    try:
        conf = "type: task\nname: said\ncommands: [echo said]\n"
        assert api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
        assert wait_for_run("said", timeout=60).status == "done"
        assert api.get("/api/projects/main/runs/said/logs?job=0").json()["text"] == "said\n"
        api.raise_request_exception = False
        assert_errors(api.get(f"/api/projects/main/runs/said/logs?job=0&start={10 ** 30}"), 400, ["start"])
    finally:
        terminate_fleet_instances(fleet)


@pytest.mark.parametrize("role", ["admin", "user", "read-only"])
def test_options_on_every_path_of_the_schema_answers_without_a_500(make_user, role):
    """OPTIONS (a browser's preflight, schemathesis' coverage phase) describes what a view takes;
    every path the schema lists answers it, whatever the caller's role, for a project that
    exists and one that does not."""
    user = make_user(f"options-{role}", role=role)
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Token {token_for(user)}")
    paths = json.loads(client.get("/api/schema/", {"format": "json"}).content)["paths"]
    assert len(paths) >= 15
    answers = {}
    for template in paths:
        for project in ("main", "nowhere"):
            path = template.replace("{project}", project).replace("{name}", "x").replace("{id}", "1")
            answers[path] = client.options(path).status_code
    assert not {p: code for p, code in answers.items() if code >= 500}, answers


@pytest.mark.parametrize("document", [
    "[" * 200_000 + "]" * 200_000,  # flow collections, as far as the body limit allows
    "".join(f"{'  ' * i}k:\n" for i in range(1_500)) + "  " * 1_500 + "v",  # block mappings
    "- " * 50_000 + "x",  # block sequences on one line
    "type: task\nenv: " + "[" * 900 + "]" * 900 + "\ncommands: [echo]\n",  # just under the parser's limit
])
def test_yaml_nested_past_what_the_parser_takes_is_a_400_at_the_configuration(raw, document):
    resp = raw.post(PLAN, json.dumps({"configuration": document}), content_type="application/json")
    if document.startswith("type"):  # loaded: then refused where it is wrong, as any other value
        assert_errors(resp, 400, ["env", 0])
    else:
        (error,) = assert_errors(resp, 400, ["configuration"])
        assert "nesting depth" in error["msg"], error


HUGE = "99999999999999999999"  # past 2**63: it reached the database as a count


@pytest.mark.parametrize("resources, loc, maximum", [
    (f"cpu: {HUGE}", ["resources", "cpu"], "cpu is at most 1000000"),
    (f"cpu: 2..{HUGE}", ["resources", "cpu"], "cpu is at most 1000000"),
    (f"cpu: {{min: 2, max: {HUGE}}}", ["resources", "cpu"], "cpu is at most 1000000"),
    (f"gpu: A100:{HUGE}", ["resources", "gpu"], "gpu count is at most 1000000"),
    (f"gpu: {{name: A100, count: {HUGE}}}", ["resources", "gpu", "count"], "gpu count is at most 1000000"),
    (f"memory: {HUGE}GB", ["resources", "memory"], "at most 1PB"),
    (f"memory: {HUGE}", ["resources", "memory"], "at most 1PB"),
    (f"disk: {HUGE}MB..", ["resources", "disk"], "at most 1PB"),
])
def test_a_resource_count_or_size_past_the_maximum_is_a_400_naming_the_field_and_the_maximum(
        raw, resources, loc, maximum):
    from runs.models import Run

    conf = f"type: task\nname: huge\ncommands: [echo]\nresources:\n  {resources}\n"
    for path in (PLAN, "/api/projects/main/runs/"):
        (error,) = assert_errors(raw.post(path, json.dumps({"configuration": conf}), content_type="application/json"),
                                 400, loc)
        assert maximum in error["msg"], error
    assert not Run.objects.exists()


def test_a_fleets_node_count_past_the_maximum_is_a_400(raw):
    from instances.models import Fleet

    conf = f"type: fleet\nname: many\nnodes: {HUGE}\nresources:\n  cpu: 2\n"
    resp = raw.post("/api/projects/main/fleets/", json.dumps({"configuration": conf}), content_type="application/json")
    errors = assert_errors(resp, 400, ["nodes"])
    assert "nodes is at most 1000000" in errors[0]["msg"], errors
    assert not Fleet.objects.exists()


@pytest.mark.parametrize("body, loc", [
    ('{"configuration": {"type": "task", "commands": ["echo \\ud800"]}}', ["configuration", "commands", 0]),
    ('{"configuration": "type: task\\ncommands: [echo]\\n", "env": {"A": "\\udfff x"}}', ["env", "A"]),
    ('{"configuration": {"type": "task", "commands": ["echo"], "env": {"\\ud800": "x"}}}',
     ["configuration", "env", "\\ud800"]),
])
def test_a_lone_utf16_surrogate_in_a_body_is_a_400_naming_where(raw, body, loc):
    """json.loads takes `\\ud800` alone; no UTF-8 encoder does: it was a 500 when the answer was written."""
    from runs.models import Run

    for path in (PLAN, "/api/projects/main/runs/"):
        (error,) = assert_errors(raw.post(path, body, content_type="application/json"), 400, loc)
        assert "surrogate" in error["msg"], error
    assert not Run.objects.exists()


@pytest.mark.parametrize("method, path", [("get", "/api/nope/"), ("post", "/api/projects/main/nope"),
                                          ("get", "/api/projects/main/runs/r1/nope")])
def test_an_api_path_no_endpoint_has_is_a_404_in_the_errors_shape(raw, method, path):
    """One error shape for everything under /api (docs/api.md): a client never reads an HTML page."""
    (error,) = assert_errors(getattr(raw, method)(path), 404, [])
    assert "no API endpoint" in error["msg"], error
