"""A create whose answer never reaches the server (slow past the client's timeout, or the
connection dropped after the API took it): the slice it made is found by its node id and used or
deleted, never left billed without a row, never made a second time."""

from __future__ import annotations

import pytest

from instances.models import InstanceGroup
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import ZONES, needs_netns, tpu_task
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]


def every_node_has_a_live_row(gcp) -> bool:
    live = set(InstanceGroup.objects.exclude(status="terminated").values_list("backend_data__node_name", flat=True))
    return set(gcp.nodes) <= live


@pytest.mark.parametrize(("answer", "idle_duration"), [("slow", "30m"), ("lost", 0)])
def test_a_create_answer_lost_after_the_api_took_it_ends_with_one_slice_used_then_kept_or_deleted(
        gcp, settings, make_fleet, submit, celery_worker, answer, idle_duration):
    settings.MUSTER = {**settings.MUSTER, "GCP": {**settings.MUSTER["GCP"], "timeout": 1}}
    if answer == "slow":
        gcp.slow_answers["create"] = 2.5  # the fake creates the node, then answers after the timeout
    else:
        gcp.lost_answers["create"] = 1  # the fake creates the node, then drops the connection
    make_fleet(idle_duration=idle_duration)

    run = wait_for_run(submit(tpu_task(f"lost-{answer}", "v4-16")), timeout=90)

    assert run.status == "done", [(j.job_num, j.status, j.termination_message) for j in run.current_jobs()]
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    name = f"projects/test-project/locations/{ZONES[0]}/nodes/{pod.name}"
    assert gcp.create_calls == [name], "the lost create is adopted, not made again"
    assert pod.backend_data["node_name"] == name
    assert {j.instance.group_id for j in run.current_jobs().select_related("instance")} == {pod.pk}
    if idle_duration == 0:
        from engine.sweeps import sweep

        wait_until(lambda: sweep()["idle"] or gcp.delete_calls, 30, "the idle pod deleted")
        wait_until(lambda: gcp.nodes == {}, 30, "the slice gone from the cloud")
        assert gcp.delete_calls == [name]
    else:
        assert list(gcp.nodes) == [name]
    assert every_node_has_a_live_row(gcp), "a slice is billed with no row to account for it"
