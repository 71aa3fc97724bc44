"""Zone fallback, capacity errors, retries and slices that never come up."""

from __future__ import annotations

from http import HTTPStatus

import pytest

from events.models import Event
from instances.models import LIVE_INSTANCE_STATUSES as LIVE
from instances.models import Instance, InstanceGroup
from runs.models import Job
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import ZONES, needs_netns, tpu_task
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]


def node(zone: str, pod: str) -> str:
    return f"projects/test-project/locations/{zone}/nodes/{pod}"


def test_exhausted_first_zone_puts_the_slice_in_the_second_and_the_run_completes(
        gcp, make_fleet, submit, celery_worker):
    gcp.exhausted_zones = {ZONES[0]}
    make_fleet()

    run = wait_for_run(submit(tpu_task("fallback", "v4-16")), timeout=90)

    assert run.status == "done", [(j.job_num, j.status, j.termination_message) for j in run.current_jobs()]
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert gcp.create_calls == [node(ZONES[0], pod.name), node(ZONES[1], pod.name)]
    assert set(pod.instances.values_list("region", flat=True)) == {ZONES[1]}
    assert pod.backend_data["node_name"] == node(ZONES[1], pod.name)
    assert pod.instances.count() == 2


def test_every_zone_exhausted_fails_the_run_for_no_capacity_and_leaves_no_instance(
        gcp, make_fleet, submit, celery_worker):
    gcp.exhausted_zones = set(ZONES)
    make_fleet()

    run = wait_for_run(submit(tpu_task("no-capacity")), timeout=60)

    jobs = list(run.current_jobs())
    assert run.status == "failed" and run.termination_reason == "job_failed"
    assert jobs[0].termination_reason == "failed_to_start_due_to_no_capacity"
    assert all(j.finished for j in jobs) and len(jobs) == 4
    assert len(gcp.create_calls) == len(ZONES), "one create attempt per zone"
    assert not Instance.objects.filter(status__in=LIVE).exists()
    assert not InstanceGroup.objects.exclude(status="terminated").exists()
    assert gcp.nodes == {}


def test_no_capacity_with_retry_goes_pending_resubmits_then_gives_up_at_the_retry_duration(
        gcp, make_fleet, submit, celery_worker, beat):
    gcp.exhausted_zones = set(ZONES)
    make_fleet()
    retry = {"on_events": ["no-capacity"], "duration": "5s"}

    run = wait_for_run(submit(tpu_task("retried", retry=retry)), timeout=60)

    assert run.status == "failed" and run.termination_reason == "retry_limit_exceeded"
    assert run.submission_num >= 1
    resubmitted = Job.objects.filter(run=run, submission_num=1)
    assert resubmitted.count() == 4, "a retry resubmits every job of the run"
    assert Job.objects.filter(run=run, submission_num=0).count() == 4, "history stays"
    assert Event.objects.filter(run=run, status="pending").exists(), "the run waited as pending"
    assert len(gcp.create_calls) == len(ZONES) * (run.submission_num + 1)
    assert not Instance.objects.filter(status__in=LIVE).exists()


def test_slice_stuck_creating_past_the_instance_limit_is_deleted_and_the_job_fails(
        gcp, make_fleet, submit, settings, celery_worker):
    settings.MUSTER = {**settings.MUSTER, "WAITING_INSTANCE_LIMIT": 3}
    gcp.stuck_creating = True
    make_fleet()

    run = wait_for_run(submit(tpu_task("stuck")), timeout=60)

    jobs = list(run.current_jobs())
    reasons = [j.termination_reason for j in jobs]
    assert run.status == "failed" and run.termination_reason == "job_failed"
    # whichever host's job timed out first fails the run; the others are stopped by the server
    assert "waiting_instance_limit_exceeded" in reasons
    assert set(reasons) <= {"waiting_instance_limit_exceeded", "terminated_by_server"}
    wait_until(lambda: gcp.delete_calls, 20, "the stuck slice's delete call")
    assert gcp.delete_calls == gcp.create_calls
    wait_until(lambda: not Instance.objects.filter(status__in=[*LIVE, "terminating"]).exists(), 20,
               "every host of the stuck slice terminated")
    assert Instance.objects.filter(status="terminated").count() == 4


# -- a stockout the way Google reports it: an accepted create whose operation fails -----------

STOCKOUT = ('There is no more capacity in the zone "{zone}"; you can try in another zone where '
            'Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions)')


@pytest.mark.parametrize("answer", ["failed-operation-at-once", "failed-operation-later", "http-429"])
def test_a_stockout_in_the_first_zone_in_any_shape_puts_the_slice_in_the_second(
        gcp, make_fleet, submit, celery_worker, answer):
    if answer == "http-429":
        gcp.exhausted_zones = {ZONES[0]}
    else:
        gcp.creation_polls = 0 if answer == "failed-operation-at-once" else 1
        gcp.failed_operations[ZONES[0]] = (8, STOCKOUT.format(zone=ZONES[0]))
    make_fleet()

    run = wait_for_run(submit(tpu_task(f"stockout-{answer}", "v4-16")), timeout=90)

    assert run.status == "done", [(j.job_num, j.status, j.termination_message) for j in run.current_jobs()]
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert gcp.create_calls == [node(ZONES[0], pod.name), node(ZONES[1], pod.name)]
    assert set(pod.instances.values_list("region", flat=True)) == {ZONES[1]}
    assert list(gcp.nodes) == [node(ZONES[1], pod.name)]


@pytest.mark.parametrize("answer", ["failed-operation-later", "http-429"])
def test_a_stockout_in_every_zone_says_which_zones_were_tried_and_what_each_said(
        gcp, make_fleet, submit, celery_worker, answer):
    for zone in ZONES:
        if answer == "http-429":
            gcp.create_errors[zone] = (HTTPStatus.TOO_MANY_REQUESTS, STOCKOUT.format(zone=zone))
        else:
            gcp.failed_operations[zone] = (8, STOCKOUT.format(zone=zone))
    make_fleet()

    run = wait_for_run(submit(tpu_task(f"nowhere-{answer}", "v4-16")), timeout=60)

    jobs = list(run.current_jobs())
    assert run.status == "failed"
    assert jobs[0].termination_reason == "failed_to_start_due_to_no_capacity"
    for zone in ZONES:
        said = f"{zone}: RESOURCE_EXHAUSTED {STOCKOUT.format(zone=zone)}"
        assert said in jobs[0].termination_message
        assert Event.objects.filter(subject__startswith="instance group", message__contains=said).exists()
    assert len(gcp.create_calls) == len(ZONES)
    wait_until(lambda: not InstanceGroup.objects.exclude(status="terminated").exists(), 20, "pod rows ended")
    assert gcp.nodes == {}


@pytest.mark.parametrize("answer", ["failed-operation", "http"])
def test_a_create_refused_for_permission_fails_at_once_and_says_what_to_fix(
        gcp, make_fleet, submit, celery_worker, answer):
    denied = "Permission 'tpu.nodes.create' denied on 'projects/test-project/locations/us-central1-a'"
    if answer == "http":
        gcp.create_errors[ZONES[0]] = (HTTPStatus.FORBIDDEN, denied)
    else:
        gcp.failed_operations[ZONES[0]] = (7, denied)
    make_fleet()

    run = wait_for_run(submit(tpu_task(f"denied-{answer}", "v4-16")), timeout=60)

    [first, *_] = run.current_jobs()
    assert run.status == "failed" and first.termination_reason == "executor_error"
    assert denied in first.termination_message
    assert "roles/tpu.admin in project test-project" in first.termination_message
    assert len(gcp.create_calls) == 1, "no other zone is tried: it would be refused the same way"
    wait_until(lambda: not Instance.objects.filter(status__in=[*LIVE, "terminating"]).exists(), 20,
               "pod rows ended")
    assert gcp.nodes == {}
