"""Deleting a gcp fleet through the API ends with nothing left in the cloud: its slices (a plain
slice, a queued multislice set) are deleted by the real worker through the real google-cloud-tpu
client against the fake, although the fleet's row goes before its groups' terminate steps run."""

from __future__ import annotations

import pytest
import yaml

from instances.models import Fleet, InstanceGroup
from tests.conftest import example
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import ZONES, needs_netns, tpu_task
from tests.tpu_e2e.test_multislice import multislice_task, two_slices  # noqa: F401 - fixture
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]


def _delete_fleet_and_wait(api, gcp, name: str) -> None:
    response = api.delete(f"/api/projects/main/fleets/{name}/")
    assert response.status_code == 202, response.content
    wait_until(lambda: not Fleet.objects.filter(name=name).exists(), 30, "the fleet removed")
    wait_until(lambda: not InstanceGroup.objects.exclude(status="terminated").exists(), 30,
               f"every group terminated: {list(InstanceGroup.objects.values_list('name', 'status'))}")


def test_deleting_a_gcp_fleet_deletes_its_idle_slice_in_the_cloud(gcp, make_fleet, submit, api, celery_worker, beat):
    make_fleet(idle_duration="off")  # the slice stays after its run: only the fleet's delete can take it
    run = wait_for_run(submit(tpu_task("before-delete", "v4-16")), timeout=90)
    assert run.status == "done"
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert len(gcp.nodes) == 1

    _delete_fleet_and_wait(api, gcp, "tpu")

    wait_until(lambda: gcp.nodes == {}, 30, "no slice left in the cloud")
    assert gcp.delete_calls == gcp.create_calls, "the slice the fleet made is the one deleted"
    assert set(pod.instances.values_list("status", flat=True)) == {"terminated"}


def test_deleting_a_queued_multislice_fleet_deletes_its_request_and_both_slices(
        gcp, two_slices, api, submit, celery_worker, beat):  # noqa: F811
    gcp.queued_script[ZONES[0]] = ["ACTIVE"]
    conf = {**yaml.safe_load(example("tpu-queued-spot-fleet.yml")), "idle_duration": "off"}
    assert api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json").status_code == 201
    run = wait_for_run(submit(multislice_task("ms-delete", fleets=["tpu-queued"])), timeout=150)
    assert run.status == "done"
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    request = f"projects/test-project/locations/{ZONES[0]}/queuedResources/{pod.name}"
    assert list(gcp.queued) == [request] and len(gcp.nodes) == 2

    _delete_fleet_and_wait(api, gcp, "tpu-queued")

    wait_until(lambda: gcp.queued == {} and gcp.nodes == {}, 30, "no queued resource and no slice left")
    assert gcp.queued_delete_calls == [(request, True)], "the request goes with its nodes (force)"
