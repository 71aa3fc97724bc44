"""Idle pods: reused by the next run of the same shape, or deleted by the fleet's idle policy."""

from __future__ import annotations

import pytest

from engine.sweeps import sweep
from instances.models import Instance, InstanceGroup
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import needs_netns, tpu_task
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]


def test_an_idle_pod_is_reused_by_the_next_run_of_the_same_shape_without_a_second_create(
        gcp, make_fleet, submit, celery_worker):
    make_fleet(idle_duration="off")

    first = wait_for_run(submit(tpu_task("first", "v4-16")), timeout=60)
    sweep()  # the idle policy is off: the pod stays
    second = wait_for_run(submit(tpu_task("second", "v4-16")), timeout=60)

    assert (first.status, second.status) == ("done", "done")
    assert len(gcp.create_calls) == 1 and gcp.delete_calls == []
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    hosts = lambda run: [j.instance_id for j in run.current_jobs()]  # noqa: E731
    assert hosts(first) == hosts(second) == list(pod.instances.order_by("index").values_list("id", flat=True))
    assert set(pod.instances.values_list("status", flat=True)) == {"idle"}


def test_a_pod_of_another_shape_is_not_reused(gcp, make_fleet, submit, celery_worker):
    make_fleet(idle_duration="off")

    wait_for_run(submit(tpu_task("small", "v4-8")), timeout=60)
    run = wait_for_run(submit(tpu_task("bigger", "v4-16")), timeout=60)

    assert run.status == "done"
    assert len(gcp.create_calls) == 2
    assert sorted(InstanceGroup.objects.values_list("shape", flat=True)) == ["v4-16", "v4-8"]


def test_idle_duration_zero_deletes_the_pod_once_its_run_is_over(gcp, make_fleet, submit, celery_worker):
    make_fleet(idle_duration=0)

    run = wait_for_run(submit(tpu_task("short-lived", "v4-16")), timeout=60)
    assert run.status == "done"
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    wait_until(lambda: set(pod.instances.values_list("status", flat=True)) == {"idle"}, 10, "idle hosts")

    found = sweep()

    assert found["idle"] == 1
    wait_until(lambda: not Instance.objects.exclude(status="terminated").exists(), 30, "hosts terminated")
    assert gcp.delete_calls == gcp.create_calls and len(gcp.delete_calls) == 1
