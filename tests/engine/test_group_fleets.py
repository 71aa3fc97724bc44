"""A group's own `fleets:`: it limits where that group goes (so a run may span fleets), and a name
that is not the task's or not the project's is a 400 at the group's field, before anything is stored."""

from __future__ import annotations

import pytest

from events.models import Event
from instances.models import Instance, InstanceStatus
from runs.models import Run
from tests.engine.helpers import Beat, job_summary, local_project_fleet, wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True)]

RUNS = "/api/projects/main/runs/"


def two_groups(name: str, x_fleets: list[str], y_fleets: list[str], task_fleets: list[str] | None = None,
               y_nodes: int = 2) -> dict:
    conf = {"type": "task", "name": name, "groups": [
        {"name": "x", "nodes": 1, "fleets": x_fleets, "commands": ["echo x on $DSTACK_NODE_IP"]},
        {"name": "y", "nodes": y_nodes, "fleets": y_fleets, "commands": ["echo y on $DSTACK_NODE_IP"]},
    ]}
    return {**conf, "fleets": task_fleets} if task_fleets is not None else conf


def errors_of(answer) -> dict[tuple, str]:
    assert answer.status_code == 400, answer.content
    return {tuple(e["loc"]): e["msg"] for e in answer.json()["errors"]}


@pytest.mark.slow
def test_each_group_goes_to_the_fleet_it_names_and_the_plan_says_which(superuser_api, fast_limits, celery_worker):
    a, b = local_project_fleet(size=2, name="a"), local_project_fleet(size=2, name="b")
    conf = two_groups("split", ["b"], ["a"])

    plan = superuser_api.post(f"{RUNS}plan", {"configuration": conf}, format="json")

    assert plan.status_code == 200, plan.content
    capacity = plan.json()["capacity"]
    assert capacity["fits"] and capacity["fleets"] == {"x": "b", "y": "a"}, capacity
    assert sorted(capacity["hosts"]["x"]) == ["b-0", "b-1"] and sorted(capacity["hosts"]["y"]) == ["a-0", "a-1"]

    assert superuser_api.post(RUNS, {"configuration": conf}, format="json").status_code == 201
    run = wait_for_run("split", timeout=60)

    assert run.status == "done", job_summary(run)
    placed = {(j.node_group_name, j.instance.fleet.name, j.fleet.name) for j in run.current_jobs()}
    assert placed == {("x", "b", "b"), ("y", "a", "a")}
    shown = superuser_api.get(f"{RUNS}split/").json()
    assert [(j["node_group_name"], j["fleet"]) for j in shown["jobs"]] == [("x", "b"), ("y", "a"), ("y", "a")]
    assert shown["fleet"] == "b", "the run's own fleet is group 0's"
    assert Event.objects.filter(run=run, message="placed across fleets: x on b, y on a").exists()
    assert {i.status for i in Instance.objects.filter(fleet__in=[a, b])} == {InstanceStatus.IDLE}


def test_without_group_fleets_a_run_that_one_fleet_holds_stays_on_one_fleet(superuser_api):
    local_project_fleet(size=1, name="a")
    local_project_fleet(size=3, name="b")
    conf = two_groups("one", [], [])

    capacity = superuser_api.post(f"{RUNS}plan", {"configuration": conf}, format="json").json()["capacity"]

    assert capacity["fleets"] == {"x": "b", "y": "b"} and capacity["fleet"] == "b", capacity


@pytest.mark.slow
def test_a_group_whose_named_fleet_is_short_takes_no_host_anywhere(superuser_api, fast_limits, celery_worker):
    a, b = local_project_fleet(size=1, name="a"), local_project_fleet(size=4, name="b")
    conf = two_groups("short", [], ["a"], y_nodes=2)

    plan = superuser_api.post(f"{RUNS}plan", {"configuration": conf}, format="json").json()["capacity"]
    assert plan["fits"] is False, plan  # b could hold both groups, but y may only go to a
    assert plan["reasons"] == ["y: needs 2 hosts: fleet a has 1 host: lower the nodes of group y to 1 or add 1 host to fleet a; "
                               "fleet b is not in the group's `fleets` (a)"], plan

    with Beat():
        assert superuser_api.post(RUNS, {"configuration": conf}, format="json").status_code == 201
        run = wait_for_run("short", timeout=60)

    assert run.status == "failed" and run.current_jobs()[0].termination_reason == "failed_to_start_due_to_no_capacity"
    assert not Run.objects.get(pk=run.pk).jobs.filter(instance__isnull=False).exists()
    assert {i.status for i in Instance.objects.filter(fleet__in=[a, b])} == {InstanceStatus.IDLE}


def test_a_group_fleet_outside_the_tasks_fleets_is_a_400_at_the_group_field(superuser_api):
    local_project_fleet(size=2, name="a")
    local_project_fleet(size=2, name="b")

    for url in (f"{RUNS}plan", RUNS):
        errors = errors_of(superuser_api.post(url, {"configuration": two_groups("out", ["a"], ["b"], ["a"])},
                                              format="json"))
        assert list(errors) == [("groups", 1, "fleets", 0)], errors
        assert "fleet `b` is not in the task's `fleets` (a)" in errors[("groups", 1, "fleets", 0)]
    assert not Run.objects.exists()


def test_a_group_fleet_the_project_does_not_have_is_a_400_naming_each(superuser_api, make_user):
    local_project_fleet(size=2, name="a")
    from instances.services.fleets import create_local_fleet
    from projects.models import Project

    create_local_fleet(Project.objects.create(name="other"), "theirs", 1, placement="cluster")

    errors = errors_of(superuser_api.post(RUNS, {"configuration": two_groups("ghost", ["ghost"], ["a", "theirs"])},
                                          format="json"))

    assert set(errors) == {("groups", 0, "fleets", 0), ("groups", 1, "fleets", 1)}, errors
    assert "the project has no fleet named `ghost`" in errors[("groups", 0, "fleets", 0)]
    assert "no fleet named `theirs`" in errors[("groups", 1, "fleets", 1)], "another project's fleet is no fleet here"
    assert not Run.objects.exists()


def test_an_empty_group_fleet_name_is_a_400(superuser_api):
    errors = errors_of(superuser_api.post(f"{RUNS}plan", {"configuration": two_groups("e", [" "], [])},
                                          format="json"))
    assert list(errors) == [("groups", 0, "fleets")], errors
