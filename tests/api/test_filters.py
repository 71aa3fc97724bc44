"""Every query parameter of the API, read through its app's api/filters.py (a django-filter FilterSet)
or, for parameters that say where or how rather than which rows, a query serializer: each one
filters, and a value it cannot take is a 400 in the errors shape naming the parameter."""

from __future__ import annotations

import pytest
from django.test import Client

from events.models import Event
from instances.models import Fleet, Instance, InstanceGroup
from projects.models import Membership, Project
from runs.models import Job, Run
from tests.conftest import token_for

pytestmark = pytest.mark.django_db

BASE = "/api/projects/main"


@pytest.fixture
def raw(make_user):
    """Raises nothing, so a 400 is seen as the caller sees it."""
    return Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Token {token_for(make_user('alice'))}")


@pytest.fixture
def main(raw):
    return Project.objects.get(name="main")


def assert_400_naming(resp, field: str) -> str:
    assert resp.status_code == 400, resp.content[:500]
    (error,) = resp.json()["errors"]
    assert error["loc"] == [field], error
    return error["msg"]


def names(resp) -> list[str]:
    assert resp.status_code == 200, resp.content[:500]
    return [row["name"] for row in resp.json()]


# ---- runs: status ---------------------------------------------------------------------------


@pytest.fixture
def runs(main):
    for name, status in (("r-running", "running"), ("r-done", "done"), ("r-failed", "failed")):
        Run.objects.create(project=main, name=name, configuration={}, status=status)


def test_runs_filter_by_status(raw, runs):
    assert names(raw.get(f"{BASE}/runs/", {"status": "done"})) == ["r-done"]
    assert names(raw.get(f"{BASE}/runs/", {"status": "terminating"})) == []
    assert sorted(names(raw.get(f"{BASE}/runs/"))) == ["r-done", "r-failed", "r-running"]
    assert sorted(names(raw.get(f"{BASE}/runs/", {"status": ""}))) == ["r-done", "r-failed", "r-running"]


def test_an_unknown_run_status_is_a_400_naming_status_and_the_statuses_there_are(raw, runs):
    msg = assert_400_naming(raw.get(f"{BASE}/runs/", {"status": "sleeping"}), "status")
    assert "unknown status" in msg and "running" in msg and "done" in msg


# ---- runs: where a log is read (job, start) -------------------------------------------------------


def test_logs_take_a_job_and_a_start_and_refuse_what_is_not_a_whole_number_in_range(raw, main, settings):
    run = Run.objects.create(project=main, name="r1", configuration={}, status="running")
    for num in (0, 1):
        Job.objects.create(run=run, job_num=num, node_group_name="g", spec={})
    body = raw.get(f"{BASE}/runs/r1/logs", {"job": "1", "start": "0"}).json()
    assert (body["job"], body["start"], body["text"]) == (1, 0, "")
    assert raw.get(f"{BASE}/runs/r1/logs").json()["job"] == 0
    most = settings.MUSTER["MAX_NODES"]
    for field, value in (("job", "one"), ("job", "-1"), ("job", str(most + 1)), ("start", "x"), ("start", "-5")):
        msg = assert_400_naming(raw.get(f"{BASE}/runs/r1/logs", {field: value}), field)
        assert "whole number" in msg or "valid integer" in msg, msg


# ---- instances: fleet, group, status ------------------------------------------------------------


@pytest.fixture
def instances(main):
    fleet = Fleet.objects.create(project=main, name="f1", backend="local", configuration={})
    other = Fleet.objects.create(project=main, name="f2", backend="local", configuration={})
    group = InstanceGroup.objects.create(project=main, fleet=other, name="g1", kind="cluster", status="active")
    rows = (("a", fleet, None, "idle"), ("b", fleet, None, "terminated"), ("c", other, group, "busy"))
    for name, in_fleet, in_group, status in rows:
        Instance.objects.create(project=main, fleet=in_fleet, group=in_group, name=name, status=status,
                                backend="local", internal_ip="127.0.0.9")


def test_instances_filter_by_fleet_group_and_status_and_leave_the_terminated_out_by_default(raw, instances):
    url = f"{BASE}/instances/"
    assert sorted(names(raw.get(url))) == ["a", "c"]
    assert names(raw.get(url, {"fleet": "f1"})) == ["a"]
    assert names(raw.get(url, {"group": "g1"})) == ["c"]
    assert names(raw.get(url, {"status": "terminated"})) == ["b"]
    assert names(raw.get(url, {"fleet": "f1", "status": "terminated"})) == ["b"]
    assert names(raw.get(url, {"fleet": "f2", "status": "idle"})) == []
    assert names(raw.get(url, {"fleet": "nowhere"})) == []


def test_an_unknown_instance_status_is_a_400_naming_status(raw, instances):
    msg = assert_400_naming(raw.get(f"{BASE}/instances/", {"status": "asleep"}), "status")
    assert "unknown status" in msg and "idle" in msg


# ---- events: run, limit -------------------------------------------------------------------------


@pytest.fixture
def events(main):
    one = Run.objects.create(project=main, name="one", configuration={})
    two = Run.objects.create(project=main, name="two", configuration={})
    for i in range(6):
        Event.objects.create(project=main, run=one if i % 2 == 0 else two, subject=f"e{i}", message=str(i))


def subjects(resp) -> list[str]:
    assert resp.status_code == 200, resp.content[:500]
    return [row["subject"] for row in resp.json()]


def test_events_filter_by_run_and_keep_the_latest_limit_oldest_first(raw, events):
    url = f"{BASE}/events/"
    assert subjects(raw.get(url)) == ["e0", "e1", "e2", "e3", "e4", "e5"]
    assert subjects(raw.get(url, {"run": "two"})) == ["e1", "e3", "e5"]
    assert subjects(raw.get(url, {"limit": "2"})) == ["e4", "e5"]
    assert subjects(raw.get(url, {"run": "one", "limit": "2"})) == ["e2", "e4"]
    assert subjects(raw.get(url, {"run": "nobody"})) == []


def test_an_event_limit_out_of_range_is_clamped_as_docs_api_md_says(raw, events):
    assert subjects(raw.get(f"{BASE}/events/", {"limit": "0"})) == ["e5"]
    assert len(subjects(raw.get(f"{BASE}/events/", {"limit": "999999"}))) == 6


def test_an_event_limit_that_is_not_a_whole_number_is_a_400_naming_limit(raw, events):
    # it used to be taken silently as the default 500
    assert_400_naming(raw.get(f"{BASE}/events/", {"limit": "lots"}), "limit")
    assert_400_naming(raw.get(f"{BASE}/events/", {"limit": "2.5"}), "limit")


# ---- members: role ------------------------------------------------------------------------------


def test_members_filter_by_role(raw, main, make_user):
    Membership.objects.create(project=main, user=make_user("bob", project=None), role="read-only")
    Membership.objects.create(project=main, user=make_user("carol", project=None), role="user")
    usernames = lambda resp: [m["username"] for m in resp.json()]  # noqa: E731
    assert usernames(raw.get(f"{BASE}/members/")) == ["alice", "bob", "carol"]
    assert usernames(raw.get(f"{BASE}/members/", {"role": "admin"})) == ["alice"]
    assert usernames(raw.get(f"{BASE}/members/", {"role": "read-only"})) == ["bob"]


def test_an_unknown_member_role_is_a_400_naming_role(raw, main):
    msg = assert_400_naming(raw.get(f"{BASE}/members/", {"role": "owner"}), "role")
    assert "read-only" in msg


# ---- DELETE ?force= -----------------------------------------------------------------------------


def test_force_that_is_not_a_boolean_is_a_400_naming_force_and_deletes_nothing(raw, main):
    Fleet.objects.create(project=main, name="f1", backend="local", configuration={})
    group = InstanceGroup.objects.create(project=main, name="g1", kind="cluster", status="active")
    # it used to be taken silently as "no"
    assert_400_naming(raw.delete(f"{BASE}/fleets/f1/?force=please"), "force")
    assert_400_naming(raw.delete(f"{BASE}/instance-groups/g1/?force=please"), "force")
    assert Fleet.objects.filter(name="f1").exists()
    group.refresh_from_db()
    assert group.status == "active"


@pytest.mark.parametrize("value", ["true", "1", "yes", "false", "0", ""])
def test_force_takes_the_booleans_the_cli_and_docs_send(raw, main, value):
    Fleet.objects.create(project=main, name="f1", backend="local", configuration={})
    assert raw.delete(f"{BASE}/fleets/f1/?force={value}").status_code == 202


# ---- the schema shows them ----------------------------------------------------------------------


def test_the_openapi_schema_shows_every_filter_parameter(raw):
    paths = raw.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    project = "/api/projects/{project}/"

    def query(path: str, method: str = "get") -> dict:
        return {p["name"]: p["schema"] for p in paths[project + path][method]["parameters"] if p["in"] == "query"}

    assert "running" in query("runs/")["status"]["enum"]
    assert set(query("instances/")) == {"fleet", "group", "status"}
    assert "terminated" in query("instances/")["status"]["enum"]
    assert query("events/")["limit"]["type"] == "integer" and query("events/")["run"]["type"] == "string"
    assert query("members/")["role"]["enum"] == ["admin", "read-only", "user"]
    assert {k: v["type"] for k, v in query("runs/{name}/logs").items()} == {"job": "integer", "start": "integer",
                                                                                 "submission": "integer"}
    assert query("fleets/{name}/", "delete")["force"]["type"] == "boolean"
    assert query("instance-groups/{name}/", "delete")["force"]["type"] == "boolean"
    assert "status" not in query("runs/", "post"), "a filter belongs to the list, not to a submission"
