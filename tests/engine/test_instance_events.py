"""Every hand-over of a host is in its history: which job took it, and when it was given back."""

from __future__ import annotations

import pytest

from tests.engine.helpers import local_project_fleet, wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_run_s_events_show_each_host_taken_by_its_group_and_given_back_by_its_job(
        fast_limits, celery_worker, superuser_api):
    fleet = local_project_fleet(size=3)
    conf = "type: task\nname: handed\nnodes: 2\ncommands: [echo]\n"
    assert superuser_api.post("/api/projects/main/runs/", {"configuration": conf},
                              format="json").status_code == 201
    run = wait_for_run("handed", timeout=60)
    assert run.status == "done"
    events = superuser_api.get("/api/projects/main/events/?run=handed").json()
    hosts = {j.instance.name for j in run.current_jobs().select_related("instance")}
    taken = {e["subject"]: e for e in events if e["subject"].startswith("instance ") and e["status"] == "busy"}
    given = {e["subject"]: e for e in events if e["subject"].startswith("instance ") and e["status"] == "idle"}
    assert set(taken) == set(given) == {f"instance {name}" for name in hosts}, events
    assert all("taken by job handed/0" in e["message"] for e in taken.values())
    assert {e["message"] for e in given.values()} == {"given back by job handed/0", "given back by job handed/1"}
    untouched = {i.name for i in fleet.instances.all()} - hosts
    assert not [e for e in events if e["subject"] in {f"instance {n}" for n in untouched}]
