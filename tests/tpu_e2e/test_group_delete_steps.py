"""A slice's delete step (terminate_group) after its fleet is gone, and when the cloud refuses it: the
engine's own fleet deletion and group step run in the test process (no worker: in a non-transactional
test the on_commit enqueues never fire), with the real TPU client against the fake API.

A fleet's deletion removes its row before its slices' delete steps run (the group's `fleet` is then
null): the step deletes with the server's settings and what the group kept of its fleet's (zones, queued
or not), never with none. A delete the cloud refuses backs off, doubling, instead of being sent again
by every sweep.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine import fleet_deletion, groups, pods
from engine.sweeps import sweep
from events.models import Event
from instances.models import Fleet, InstanceGroup
from instances.services.fleets import delete_fleet
from tests.tpu_e2e.helpers import ZONES
from tests.tpu_e2e.test_pod_rows import fleet, gcp_settings, reserve  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


def _ready_pod(fleet) -> InstanceGroup:  # noqa: F811
    reserve(fleet, "v4-16")
    pod = InstanceGroup.objects.get(kind="tpu_pod")
    for _ in range(3):
        pods.poll_pod(pod.pk)
    pod.refresh_from_db()
    assert pod.status == "active"
    return pod


def _fleet_deleted(fleet) -> None:  # noqa: F811
    """What DELETE fleets/X and its delete_fleet step do; the group's step has not run yet."""
    InstanceGroup.objects.filter(fleet=fleet).update(status="active")
    fleet.instances.update(status="idle")
    delete_fleet(fleet, force=True)
    assert fleet_deletion.delete_fleet(fleet.pk)
    assert not Fleet.objects.filter(pk=fleet.pk).exists()


@pytest.mark.parametrize("recorded", [True, False], ids=["node-name-recorded", "node-name-lost"])
def test_a_slice_whose_fleet_is_gone_is_deleted_with_the_server_settings_and_the_fleets_zones_it_kept(
        fleet, gcp_settings, recorded):  # noqa: F811
    pod = _ready_pod(fleet)
    [node] = list(gcp_settings.nodes)
    assert node.startswith(f"projects/test-project/locations/{ZONES[0]}/")
    if not recorded:  # the worker died in the create: the node is found by its id in the fleet's zones
        InstanceGroup.objects.filter(pk=pod.pk).update(
            backend_data={k: v for k, v in pod.backend_data.items() if k in ("backend", "fleet")})
    _fleet_deleted(fleet)
    pod.refresh_from_db()
    assert (pod.status, pod.fleet_id) == ("terminating", None)

    assert groups.terminate_group(pod.pk)

    pod.refresh_from_db()
    assert pod.status == "terminated"
    assert gcp_settings.nodes == {}, "the slice is deleted in the cloud"
    assert gcp_settings.delete_calls == [node]
    assert "ssh_private_key" not in pod.backend_data["fleet"], "a group keeps no secret of its fleet's"


def test_a_delete_the_cloud_refuses_backs_off_doubling_and_no_sweep_sends_it_meanwhile(
        fleet, gcp_settings, settings):  # noqa: F811
    pod = _ready_pod(fleet)
    _fleet_deleted(fleet)
    gcp_settings.dropped_requests["delete"] = 2  # the API does not answer two deletes
    lease = float(settings.MUSTER["LEASE_SECONDS"])
    waits = []

    for _ in range(2):
        InstanceGroup.objects.filter(pk=pod.pk).update(updated=timezone.now() - timedelta(hours=1))
        assert not groups.terminate_group(pod.pk)
        pod.refresh_from_db()
        assert (pod.status, pod.lease_token) == ("terminating", ""), "given back, held by nobody"
        assert pod.lease_until is not None, "given back with a backoff, not free for the next sweep"
        waits.append((pod.lease_until - timezone.now()).total_seconds())
        assert sweep()["groups"] == 0, "a group backing off is not sent again by the sweep"
        assert not groups.terminate_group(pod.pk), "nor claimed by a delivery meanwhile"
        InstanceGroup.objects.filter(pk=pod.pk).update(lease_until=timezone.now() - timedelta(seconds=1))

    assert lease * 0.5 < waits[0] <= lease and lease * 1.5 < waits[1] <= 2 * lease, waits
    assert pod.backend_data["delete_failures"] == 2
    failures = Event.objects.filter(subject=f"instance group {pod.name}", message__startswith="delete failed")
    assert failures.count() == 2
    assert len(gcp_settings.nodes) == 1

    assert sweep()["groups"] == 1, "once the backoff is over the sweep sends it again"
    assert groups.terminate_group(pod.pk)
    assert gcp_settings.nodes == {}
