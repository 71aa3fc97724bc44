"""Slices requested as Cloud TPU queued resources, end to end: the fleet's `queued_resource` through
the API, the real worker polling the fake's queued resources (real google-cloud-tpu client), and
the slice's hosts as namespace sshd hosts."""

from __future__ import annotations

import time

import pytest
import yaml

from events.models import Event
from instances.models import LIVE_INSTANCE_STATUSES as LIVE
from instances.models import Instance, InstanceGroup
from runs.services import logs
from tests.conftest import example
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import ZONES, env_line, needs_netns, tpu_task
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]


def request_name(zone: str, pod: str) -> str:
    return f"projects/test-project/locations/{zone}/queuedResources/{pod}"


@pytest.fixture
def make_fleet(api):
    """POST examples/tpu-queued-spot-fleet.yml through the API, with `changes` applied on top."""

    def make(**changes) -> dict:
        conf = {**yaml.safe_load(example("tpu-queued-spot-fleet.yml")), **changes}
        response = api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json")
        assert response.status_code == 201, response.content
        return response.json()

    return make


def queued_task(name: str, **changes) -> dict:
    return tpu_task(name, "v4-16", fleets=["tpu-queued"], **changes)


def test_a_queued_spot_slice_waits_for_resources_says_so_then_runs_rank_k_on_host_k(
        gcp, make_fleet, submit, api, celery_worker):
    gcp.queued_script[ZONES[0]] = ["CREATING", *["WAITING_FOR_RESOURCES"] * 12, "PROVISIONING", "ACTIVE"]
    make_fleet()
    name = submit(queued_task("queued"))

    messages = set()

    def seen_waiting() -> bool:
        jobs = api.get(f"/api/projects/main/runs/{name}/").json()["jobs"]
        messages.update(j.get("status_message") or "" for j in jobs)
        return any(m.startswith(f"queued in {ZONES[0]}: WAITING_FOR_RESOURCES for ") for m in messages)

    wait_until(seen_waiting, 30, "a job's message naming the queued state and zone")
    [group] = api.get("/api/projects/main/instance-groups/").json()
    assert group["queued_resource"]["name"] == request_name(ZONES[0], group["name"])
    run = wait_for_run(name, timeout=90)

    assert run.status == "done", [(j.job_num, j.status, j.termination_message) for j in run.current_jobs()]
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert gcp.queued_create_calls == [request_name(ZONES[0], pod.name)]
    assert gcp.create_calls == gcp.queued_create_calls, "no direct node create next to the request"
    qr = gcp.queued[request_name(ZONES[0], pod.name)].qr
    assert qr.spot is not None and qr.queueing_policy.valid_until_duration.total_seconds() == 7200
    assert Event.objects.filter(run=run, message=f"queued resource in {ZONES[0]}: WAITING_FOR_RESOURCES").exists()
    for job in run.current_jobs().select_related("instance"):
        assert job.instance.index == job.job_num
        assert env_line(logs.read(job).decode())["worker"] == str(job.job_num)
    assert pod.backend_data["queued_resource"] == request_name(ZONES[0], pod.name)


def test_a_request_queued_longer_than_the_instance_limit_still_gets_its_slice_made_and_used(
        gcp, make_fleet, submit, settings, celery_worker):
    # WAITING_INSTANCE_LIMIT bounds making a slice, not Google's queue: it counts from ACTIVE.
    settings.MUSTER = {**settings.MUSTER, "WAITING_INSTANCE_LIMIT": 3}
    gcp.queued_script[ZONES[0]] = ["CREATING", *["WAITING_FOR_RESOURCES"] * 20, "ACTIVE"]
    gcp.queued_node_polls = 2  # the node shows READY a couple of looks after the request is ACTIVE
    make_fleet()

    run = wait_for_run(submit(queued_task("queued-long")), timeout=90)

    assert run.status == "done", [(j.job_num, j.status, j.termination_message) for j in run.current_jobs()]
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert (pod.updated - pod.created).total_seconds() > 3, "the request waited past the limit"
    assert gcp.queued_delete_calls == []


def test_failed_for_capacity_in_one_zone_deletes_that_request_then_the_next_zone_runs_it_never_two_live(
        gcp, make_fleet, submit, celery_worker):
    gcp.queued_script[ZONES[0]] = ["CREATING", "WAITING_FOR_RESOURCES", ("FAILED", 8, "no v4-16 capacity left")]
    make_fleet(queued_resource=True)

    run = wait_for_run(submit(queued_task("queued-fallback")), timeout=90)

    assert run.status == "done", [(j.job_num, j.status, j.termination_message) for j in run.current_jobs()]
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    first, second = request_name(ZONES[0], pod.name), request_name(ZONES[1], pod.name)
    assert gcp.queued_create_calls == [first, second]
    assert gcp.queued_delete_calls == [(first, True)], "the failed request is deleted, with force"
    assert gcp.queued_overlaps == [], "a request was made while another of the slice was live"
    assert set(pod.instances.values_list("region", flat=True)) == {ZONES[1]}


def test_valid_until_expiring_in_every_zone_ends_in_no_capacity_naming_each_zone_and_leaves_nothing(
        gcp, make_fleet, submit, celery_worker):
    gcp.queued_expire_zones = set(ZONES)
    make_fleet(queued_resource={"valid_until": "1s"})

    run = wait_for_run(submit(queued_task("queued-expired")), timeout=90)

    [first, *_] = run.current_jobs()
    assert run.status == "failed" and first.termination_reason == "failed_to_start_due_to_no_capacity"
    for zone in ZONES:
        assert f"{zone}: DEADLINE_EXCEEDED Queued resource request expired" in first.termination_message
    assert len(gcp.queued_create_calls) == len(ZONES)
    pod = InstanceGroup.objects.get(kind="tpu_pod")
    assert {request_name(zone, pod.name) for zone in ZONES} <= {n for n, force in gcp.queued_delete_calls if force}
    assert all(force for _, force in gcp.queued_delete_calls)
    assert gcp.queued_overlaps == []
    wait_until(lambda: not InstanceGroup.objects.exclude(status="terminated").exists(), 20, "pod rows ended")
    assert gcp.queued == {} and gcp.nodes == {}
    assert not Instance.objects.filter(status__in=LIVE).exists()


def test_a_queued_create_whose_answer_is_lost_is_found_by_its_id_and_adopted_not_made_twice(
        gcp, settings, make_fleet, submit, celery_worker):
    settings.MUSTER = {**settings.MUSTER, "GCP": {**settings.MUSTER["GCP"], "timeout": 1}}
    gcp.lost_answers["queued_create"] = 1  # the request is recorded, the answer never arrives
    make_fleet(queued_resource=True)

    run = wait_for_run(submit(queued_task("queued-lost")), timeout=90)

    assert run.status == "done", [(j.job_num, j.status, j.termination_message) for j in run.current_jobs()]
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert gcp.queued_create_calls == [request_name(ZONES[0], pod.name)], "adopted, not made again"
    assert list(gcp.queued) == [request_name(ZONES[0], pod.name)]


def test_a_lost_create_that_a_lookup_cannot_see_yet_is_sent_again_and_adopted_on_409(
        gcp, settings, make_fleet, submit, celery_worker):
    settings.MUSTER = {**settings.MUSTER, "GCP": {**settings.MUSTER["GCP"], "timeout": 1}}
    gcp.lost_answers["queued_create"] = 1
    make_fleet(queued_resource=True)
    name = submit(queued_task("queued-409"))
    wait_until(lambda: gcp.queued_create_calls, 30, "the first create")
    gcp.queued_invisible_gets = 100  # lookups miss it past the lost-create grace (2 x the timeout)
    wait_until(lambda: len(gcp.queued_create_calls) == 2, 30, "the create sent again")
    time.sleep(1)  # lookups still miss it for a while after the 409
    gcp.queued_invisible_gets = 0

    run = wait_for_run(name, timeout=90)

    assert run.status == "done", [(j.job_num, j.status, j.termination_message) for j in run.current_jobs()]
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert gcp.queued_create_calls == [request_name(ZONES[0], pod.name)] * 2, "same id, same zone: 409"
    assert list(gcp.queued) == [request_name(ZONES[0], pod.name)], "one request, adopted"
    assert gcp.queued_overlaps == []


def test_deleting_a_queued_pod_deletes_its_request_with_force(gcp, make_fleet, submit, api, celery_worker):
    gcp.queued_script[ZONES[0]] = ["ACTIVE"]
    make_fleet(queued_resource=True)
    run = wait_for_run(submit(queued_task("queued-delete")), timeout=90)
    assert run.status == "done"
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")

    assert api.delete(f"/api/projects/main/instance-groups/{pod.name}-1/").status_code == 202

    wait_until(lambda: gcp.queued == {}, 20, "the request deleted")
    assert gcp.queued_delete_calls == [(request_name(ZONES[0], pod.name), True)]
    assert gcp.nodes == {}, "force deletes the request's node too"
