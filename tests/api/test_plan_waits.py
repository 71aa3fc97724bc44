"""The plan says when a run would wait for hosts of a full fleet (engine/submitted/waiting.py)
instead of failing: its retry lists no-capacity, and the fleet would hold it once its busy hosts
are free. Through the REST API and the `muster` CLI's words for it."""

from __future__ import annotations

import pytest

from cli import render
from instances.models import InstanceStatus
from tests.api.test_submit_statements import ssh_fleet

pytestmark = pytest.mark.django_db

PLAN = "/api/projects/main/runs/plan"
WAITING = "type: task\nnodes: 2\ncommands: [echo]\nretry: {on_events: [no-capacity], duration: 1h}\n"


def _full(project, hosts: int = 2):
    fleet = ssh_fleet(project, hosts)
    fleet.instances.update(status=InstanceStatus.BUSY)
    return fleet


def test_a_plan_on_a_full_fleet_says_the_run_would_wait_when_its_retry_lists_no_capacity(api, project):
    _full(project)
    capacity = api.post(PLAN, {"configuration": WAITING}, format="json").json()["capacity"]
    assert capacity["fits"] is False
    assert capacity["waits_for"] == "a free host: fleet hosts is full"
    assert any("0 of them idle" in line for line in capacity["reasons"]), capacity["reasons"]
    assert "waits for a free host: fleet hosts is full" in render.would_wait(capacity["waits_for"])


def test_a_plan_says_no_wait_without_retry_or_when_no_fleet_could_ever_hold_the_run(api, project):
    _full(project)
    no_retry = api.post(PLAN, {"configuration": "type: task\nnodes: 2\ncommands: [echo]\n"}, format="json")
    assert "waits_for" not in no_retry.json()["capacity"]
    errors_only = WAITING.replace("[no-capacity]", "[error]")
    assert "waits_for" not in api.post(PLAN, {"configuration": errors_only}, format="json").json()["capacity"]
    too_big = WAITING.replace("nodes: 2", "nodes: 3")
    capacity = api.post(PLAN, {"configuration": too_big}, format="json").json()["capacity"]
    assert capacity["fits"] is False and "waits_for" not in capacity, "3 nodes never fit 2 hosts: no wait"
