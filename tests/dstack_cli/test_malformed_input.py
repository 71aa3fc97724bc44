"""tests/api/test_malformed_input.py through /dstack: the same hostile bodies, in dstack's shapes, get
the same 4xx as the native API, answered in dstack's error format (one `detail` entry), never a 500
or an HTML page, and nothing is written."""

from __future__ import annotations

import base64
import copy
import json

import pytest
from django.test import Client

from instances.models import Fleet
from muster.text import NUL_MESSAGE
from runs.models import Run
from tests.conftest import token_for
from tests.dstack_cli.bodies import FLEET_SPEC, RUN_SPEC, TASK, dstack_client, one_detail, post

pytestmark = pytest.mark.django_db

PLAN = "/dstack/api/project/main/runs/get_plan"


@pytest.fixture
def raw(make_user):
    """Sends bytes as they are and raises nothing, as a hostile client would."""
    return Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {token_for(make_user('alice'))}")


def refused(resp, status: int = 400) -> str:
    assert resp["Content-Type"].startswith("application/json"), (resp.status_code, resp["Content-Type"])
    return one_detail(resp, status, "error")


def spec_with(**configuration) -> dict:
    return {**copy.deepcopy(RUN_SPEC), "configuration": {**copy.deepcopy(TASK), **configuration}}


def test_deeply_nested_json_is_one_dstack_error(raw):
    body = '{"run_spec": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert "nested" in refused(raw.post(PLAN, body, content_type="application/json"))


def test_json_nested_a_little_less_deep_is_refused_too(raw):
    spec = spec_with(env={"A": "x"})
    body = json.dumps({"run_spec": spec}).replace('"x"', "[" * 500 + "]" * 500)
    assert "nested" in refused(raw.post(PLAN, body, content_type="application/json"))


def test_an_integer_over_4300_digits_is_one_dstack_error(raw):
    body = json.dumps({"run_spec": spec_with(nodes=7)}).replace('"nodes": 7', '"nodes": ' + "9" * 5000)
    assert "4300" in refused(raw.post(PLAN, body, content_type="application/json"))


def test_a_body_over_the_size_limit_is_a_413_in_dstacks_format(raw, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"run_spec": spec_with(commands=["echo padding"] * 200)})
    assert "1000" in refused(raw.post(PLAN, body, content_type="application/json"), 413)


@pytest.mark.parametrize("path, body, where", [
    ("runs/apply", {"plan": {"run_spec": spec_with(commands=["echo \x00 hi"])}}, "configuration.commands.0"),
    ("runs/apply", {"plan": {"run_spec": spec_with(working_dir="/w\x00")}}, "configuration.working_dir"),
    ("runs/apply", {"plan": {"run_spec": spec_with(env={"A": "x\x00"})}}, "configuration.env.A"),
    ("runs/get_plan", {"run_spec": {**RUN_SPEC, "configuration_path": "t\x00.yml"}}, "run_spec.configuration_path"),
    ("fleets/apply", {"plan": {"spec": {**FLEET_SPEC, "configuration": {
        **FLEET_SPEC["configuration"], "ssh_config": {**FLEET_SPEC["configuration"]["ssh_config"], "user": "u\x00"}}}}},
     "configuration.ssh_config.user"),
])
def test_a_nul_character_in_a_body_is_one_dstack_error_naming_where(alice, path, body, where):
    """PostgreSQL cannot store a NUL: it was a 500 once the value reached a write."""
    msg = one_detail(post(alice, f"project/main/{path}", body), 400, "error")
    assert where in msg and NUL_MESSAGE in msg, msg
    assert not Run.objects.exists() and not Fleet.objects.exists()


def test_a_nul_in_the_project_of_the_path_is_not_found(alice):
    assert one_detail(post(alice, "project/ma\x00in/runs/get", {"run_name": "r"}), 400, "resource_not_exists")
    assert one_detail(post(alice, "projects/ma\x00in/get"), 400, "resource_not_exists")


@pytest.mark.parametrize("token", [str(10**30), "-1", "²", "1e5"])
def test_a_huge_or_odd_next_token_on_logs_poll_is_a_400_naming_it(alice, token):
    applied = post(alice, "project/main/runs/apply", {"plan": {"run_spec": spec_with(nodes=1)}})
    assert applied.status_code == 200, applied.content
    submission = applied.json()["jobs"][0]["job_submissions"][-1]["id"]
    body = {"run_name": "hello", "job_submission_id": submission, "next_token": token}
    assert refused(post(alice, "project/main/logs/poll", body)).startswith("next_token")


@pytest.mark.django_db(transaction=True)
def test_a_huge_next_token_on_a_finished_jobs_stored_log_is_a_400(fast_limits, celery_worker, make_user):
    from engine.groups import terminate_fleet_instances
    from tests.engine.helpers import local_project_fleet, wait_for_run

    alice = dstack_client(make_user("alice"))
    fleet = local_project_fleet(size=1)
    try:
        spec = {**spec_with(nodes=1, name="said", commands=["echo said"]), "run_name": "said"}
        assert post(alice, "project/main/runs/apply", {"plan": {"run_spec": spec}}).status_code == 200
        assert wait_for_run("said", timeout=60).status == "done"
        run = post(alice, "project/main/runs/get", {"run_name": "said"}).json()
        body = {"run_name": "said", "job_submission_id": run["jobs"][0]["job_submissions"][-1]["id"]}
        logs = post(alice, "project/main/logs/poll", body).json()["logs"]
        assert b"".join(base64.b64decode(line["message"]) for line in logs) == b"said\n"
        assert refused(post(alice, "project/main/logs/poll", {**body, "next_token": str(10**30)})) \
            .startswith("next_token")
    finally:
        terminate_fleet_instances(fleet)


PATHS = ["projects/{p}/get", "users/get_my_user", "runs/list", "project/{p}/repos/init", "project/{p}/runs/get_plan",
         "project/{p}/runs/apply", "project/{p}/runs/get", "project/{p}/runs/stop", "project/{p}/runs/delete",
         "project/{p}/logs/poll", "project/{p}/fleets/list", "project/{p}/fleets/get", "project/{p}/fleets/get_plan",
         "project/{p}/fleets/apply", "project/{p}/fleets/delete", "project/{p}/fleets/delete_instances"]


@pytest.mark.parametrize("role", ["admin", "user", "read-only"])
def test_options_and_get_on_every_path_answer_without_a_500(make_user, role):
    """dstack's calls are POSTs; a browser's preflight or a stray GET gets a 4xx or the view's
    description, whatever the caller's role, for a project that exists and one that does not."""
    user = make_user(f"options-{role}", role=role)
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    answers = {}
    for template in PATHS:
        for project in ("main", "nowhere"):
            path = "/dstack/api/" + template.format(p=project)
            answers[("OPTIONS", path)] = client.options(path).status_code
            answers[("GET", path)] = client.get(path).status_code
    assert not {call: code for call, code in answers.items() if code >= 500}, answers
    assert {code for (verb, _), code in answers.items() if verb == "GET"} <= {400, 403, 405}, answers


HUGE = 99999999999999999999  # past 2**63: it reached the database as a count


@pytest.mark.parametrize("resources, where, maximum", [
    ({"cpu": {"arch": None, "count": {"min": HUGE, "max": None}}}, "resources.cpu", "cpu is at most 1000000"),
    ({"gpu": {"name": ["A100"], "count": {"min": 1, "max": HUGE}}}, "resources.gpu.count",
     "gpu count is at most 1000000"),
    ({"memory": {"min": HUGE, "max": None}}, "resources.memory", "at most 1PB"),
    ({"disk": {"size": {"min": float(HUGE), "max": None}}}, "resources.disk", "at most 1PB"),
])
def test_a_resource_past_the_maximum_is_one_dstack_error_naming_the_field_and_the_maximum(
        alice, resources, where, maximum):
    spec = spec_with(resources={**TASK["resources"], **resources})
    for path, body in (("runs/get_plan", {"run_spec": spec}), ("runs/apply", {"plan": {"run_spec": spec}})):
        msg = one_detail(post(alice, f"project/main/{path}", body), 400, "error")
        assert where in msg and maximum in msg, msg
    assert not Run.objects.exists()


def test_a_lone_utf16_surrogate_in_a_body_is_one_dstack_error_naming_where(raw):
    """json.loads takes `\\ud800` alone; no UTF-8 encoder does: it was a 500 when the answer was written."""
    body = json.dumps({"plan": {"run_spec": spec_with(commands=["echo SURROGATE"])}}).replace("SURROGATE", "\\ud800")
    for path in ("runs/get_plan", "runs/apply"):
        sent = body if path == "runs/apply" else json.dumps({"run_spec": spec_with(working_dir="/wSURROGATE")}) \
            .replace("SURROGATE", "\\udc00")
        msg = refused(raw.post(f"/dstack/api/project/main/{path}", sent, content_type="application/json"))
        assert "surrogate" in msg and ("commands.0" in msg or "working_dir" in msg), msg
    assert not Run.objects.exists()
