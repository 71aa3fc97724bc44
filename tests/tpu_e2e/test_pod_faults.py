"""The two claimed steps of a TPU slice survive their messages delivered twice and their first
message lost (the sweep sends it again): poll_pod, which looks at a slice being created until it is
READY, and terminate_group, which deletes it at Google. The fake TPU API counts the creates and
deletes, so "once" is what the server saw."""

from __future__ import annotations

import pytest

from events.models import Event
from instances.models import Instance, InstanceGroup
from runs.services import logs
from tests.engine.faults import celery_worker_parameters, celery_worker_pool, inject  # noqa: F401
from tests.engine.helpers import job_summary, wait_for_run
from tests.tpu_e2e.helpers import env_line, needs_netns, tpu_task
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]

MODES = ["twice", "drop"]


def _injected(faulty, mode: str) -> None:
    if mode == "drop":
        assert faulty.dropped == 1 and faulty.sent >= 2, "the first message was lost and the sweep sent another"
    else:
        assert faulty.doubled >= 1, "a message was delivered twice"


@pytest.mark.parametrize("mode", MODES)
def test_a_slice_being_created_is_polled_to_ready_once_when_a_poll_is_duplicated_or_lost(
        mode, gcp, make_fleet, submit, beat, celery_worker, monkeypatch):
    gcp.creation_polls = 3  # several polls before READY, each sent through the fault
    make_fleet(idle_duration="off")
    faulty = inject(monkeypatch, "poll_pod", mode)

    run = wait_for_run(submit(tpu_task(f"polled-{mode}", "v4-16")), timeout=60)

    assert run.status == "done", job_summary(run)
    _injected(faulty, mode)
    assert len(gcp.create_calls) == 1, "one slice created"
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert pod.status == "active" and pod.lease_token == ""
    hosts = list(pod.instances.order_by("index"))
    assert [j.instance_id for j in run.current_jobs().order_by("job_num")] == [h.pk for h in hosts]
    for host in hosts:  # READY was applied once: one "ready at" per host
        assert Event.objects.filter(instance=host, message__startswith="ready at").count() == 1, host.name
    for job in run.current_jobs():
        assert env_line(logs.read(job).decode())["rank"] == str(job.job_num), "each job ran once"


@pytest.mark.parametrize("mode", MODES)
def test_a_slice_deleted_through_the_api_is_deleted_once_when_its_message_is_duplicated_or_lost(
        mode, gcp, make_fleet, submit, api, beat, celery_worker, monkeypatch):
    make_fleet(idle_duration="off")
    run = wait_for_run(submit(tpu_task(f"before-delete-{mode}", "v4-16")), timeout=60)
    assert run.status == "done", job_summary(run)
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    faulty = inject(monkeypatch, "terminate_group", mode)

    response = api.delete(f"/api/projects/main/instance-groups/{pod.name}/")

    assert response.status_code == 202, response.content
    wait_until(lambda: not Instance.objects.filter(group=pod).exclude(status="terminated").exists(), 20,
               "the slice's hosts terminated")
    _injected(faulty, mode)
    assert gcp.delete_calls == gcp.create_calls and len(gcp.delete_calls) == 1, "the slice deleted once at Google"
    assert gcp.nodes == {}
    pod.refresh_from_db()
    assert pod.status == "terminated" and pod.lease_token == ""
    assert Event.objects.filter(subject=f"instance group {pod.name}", message="deleted").count() == 1
