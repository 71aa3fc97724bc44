"""`type: service` through the REST API: the plan's replicas, the submit's replica jobs, the run's
`service` field, and the in-place update of a running service of the same name."""

from __future__ import annotations

import pytest

from events.models import Event
from runs.models import Job, Run

pytestmark = pytest.mark.django_db

SERVICE = {"type": "service", "name": "web", "port": 8000, "commands": ["python3 -m http.server 8000"],
           "replicas": 2}
RUNS = "/api/projects/main/runs/"


def submit(api, configuration, **extra):
    return api.post(RUNS, {"configuration": configuration, **extra}, format="json")


def test_the_plan_shows_each_group_s_replicas_and_the_service_url(api, settings):
    settings.MUSTER = {**settings.MUSTER, "ENDPOINT_URL": "https://models.example.com/"}
    conf = {"type": "service", "name": "pd", "port": 8000, "groups": [
        {"name": "router", "replicas": 1, "commands": ["serve"]},
        {"name": "worker", "replicas": "1..3", "scaling": {"metric": "rps", "target": 5}, "commands": ["work"]}]}
    resp = api.post(f"{RUNS}plan", {"configuration": conf}, format="json")
    assert resp.status_code == 200, resp.json()
    body = resp.json()
    assert body["replicas"] == {"router": {"min": 1, "max": 1, "desired": 1},
                                "worker": {"min": 1, "max": 3, "desired": 1}}
    assert body["service_url"] == "https://models.example.com/proxy/services/main/pd/"
    assert [(j["node_group_name"], j["replica_num"]) for j in body["jobs"]] == [("router", 0), ("worker", 0)]
    assert body["configuration"]["groups"][1]["scaling"]["target"] == 5
    assert set(body["capacity"]) >= {"fits", "reasons"}
    assert body["updates"] is None


def test_every_problem_of_a_service_is_one_400_naming_its_field(api):
    conf = {"type": "service", "commands": ["x"], "replicas": "1..4", "nodes": 0, "auth": "yes"}
    resp = submit(api, conf)
    assert resp.status_code == 400
    locs = {tuple(e["loc"]) for e in resp.json()["errors"]}
    assert {("port",), ("auth",), ("nodes",)} <= locs
    assert Run.objects.count() == 0


def test_a_service_submits_a_job_per_replica_each_claimable_at_once(api, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        resp = submit(api, SERVICE)
    assert resp.status_code == 201, resp.json()
    run = Run.objects.get(name="web")
    assert run.desired_replicas == {"0": 2} and run.deployment_num == 0
    jobs = list(run.jobs.order_by("job_num"))
    assert [(j.node_group_name, j.replica_num, j.node_group_rank) for j in jobs] == [("0", 0, 0), ("0", 1, 0)]
    assert [j.waiting_master_job for j in jobs] == [False, False]
    assert len(callbacks) == 2, "each replica's provisioning is enqueued"
    assert "2 replicas" in Event.objects.get(run=run).message


def test_a_scaled_group_starts_at_its_minimum_and_zero_makes_no_job(api):
    conf = {**SERVICE, "replicas": "0..3", "scaling": {"metric": "rps", "target": 2}}
    resp = submit(api, conf)
    assert resp.status_code == 201, resp.json()
    run = Run.objects.get(name="web")
    assert run.desired_replicas == {"0": 0} and run.jobs.count() == 0
    assert resp.json()["service"]["replicas"] == {"ready": 0, "total": 0}


def test_the_run_answer_has_the_service_url_and_its_ready_replicas(api, settings):
    settings.MUSTER = {**settings.MUSTER, "ENDPOINT_URL": "http://10.0.0.5:8001"}
    body = submit(api, SERVICE).json()
    assert body["service"] == {"url": "http://10.0.0.5:8001/proxy/services/main/web/",
                               "replicas": {"ready": 0, "total": 2}}
    job = Job.objects.get(run__name="web", replica_num=1)
    Job.objects.filter(pk=job.pk).update(status="running", ready_at="2030-01-01T00:00:00Z")
    detail = api.get(f"{RUNS}web/").json()
    assert detail["service"]["replicas"] == {"ready": 1, "total": 2}
    assert [j["replica_num"] for j in detail["jobs"]] == [0, 1]
    listed = api.get(RUNS).json()
    assert listed[0]["service"]["url"].endswith("/proxy/services/main/web/")
    task = submit(api, {"type": "task", "commands": ["echo"]}).json()
    assert task["service"] is None


def test_applying_a_running_service_again_needs_update_and_then_rolls_it_in_place(api, django_capture_on_commit_callbacks):
    assert submit(api, SERVICE).status_code == 201
    again = submit(api, {**SERVICE, "replicas": 3})
    assert again.status_code == 400
    assert "update" in again.json()["errors"][0]["msg"]
    plan = api.post(f"{RUNS}plan", {"configuration": {**SERVICE, "replicas": 3}}, format="json").json()
    assert plan["updates"]["deployment_num"] == 1
    with django_capture_on_commit_callbacks() as callbacks:
        resp = submit(api, {**SERVICE, "replicas": 3, "env": {"V": "2"}}, update=True)
    assert resp.status_code == 200, resp.json()
    run = Run.objects.get(name="web")
    assert run.deployment_num == 1 and run.desired_replicas == {"0": 3}
    assert run.configuration["env"] == {"V": "2"}
    assert run.jobs.count() == 2, "the engine makes the new deployment's replicas, not the submit"
    assert len(callbacks) == 1, "the run is nudged once"
    assert Event.objects.filter(run=run, message__contains="deployment 1").exists()
    assert resp.json()["deployment_num"] == 1


def test_an_update_keeps_a_scaled_group_s_count_within_the_new_range(api):
    conf = {**SERVICE, "replicas": "2..6", "scaling": {"metric": "rps", "target": 2}}
    assert submit(api, conf).status_code == 201
    Run.objects.filter(name="web").update(desired_replicas={"0": 5})
    resp = submit(api, {**conf, "replicas": "1..4"}, update=True)
    assert resp.status_code == 200, resp.json()
    assert Run.objects.get(name="web").desired_replicas == {"0": 4}


@pytest.mark.parametrize("first,second,phrase", [
    ({"type": "task", "name": "web", "commands": ["sleep 9"]}, SERVICE, "is a task"),
    (SERVICE, {"type": "task", "name": "web", "commands": ["echo"]}, "must keep `type: service`"),
])
def test_an_update_of_a_task_or_to_a_task_is_a_409(api, first, second, phrase):
    assert submit(api, first).status_code == 201
    resp = submit(api, second, update=True)
    assert resp.status_code == 409, resp.json()
    assert resp.json()["errors"][0]["loc"] == ["update"] and phrase in resp.json()["errors"][0]["msg"]
    assert Run.objects.get(name="web").deployment_num == 0


def test_an_update_without_a_running_service_of_the_name_submits_a_new_one(api):
    resp = submit(api, SERVICE, update=True)
    assert resp.status_code == 201, resp.json()
    assert Run.objects.get(name="web").jobs.count() == 2


def test_update_must_be_a_boolean(api):
    resp = submit(api, SERVICE, update="yes")
    assert resp.status_code == 400 and resp.json()["errors"][0]["loc"] == ["update"]


def test_the_local_service_example_plans_two_replicas_probed_on_its_port(api):
    from tests.conftest import example

    resp = api.post(f"{RUNS}plan", {"configuration": example("service-local.yml")}, format="json")
    assert resp.status_code == 200, resp.json()
    body = resp.json()
    assert body["replicas"] == {"0": {"min": 2, "max": 2, "desired": 2}} and body["warnings"] == []
    assert body["configuration"]["groups"][0]["probes"][0]["port"] == 8000
