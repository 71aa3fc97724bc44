"""`fleets/delete_instances` (dstack's `fleet delete NAME -i N`): the chosen hosts leave the fleet and
the rest stay; all or nothing, refused for a host that runs a job, a fleet still registering, a host
of a TPU slice (deleted whole) and an index the fleet does not have. The real CLI drives it in
test_core_loop.py."""

from __future__ import annotations

import pytest

from instances.models import (
    Fleet,
    FleetBackend,
    FleetStatus,
    GroupKind,
    Instance,
    InstanceGroup,
    InstanceStatus,
)
from projects.models import Project
from tests.dstack_cli.bodies import dstack_client, one_detail, post, small_fleet

pytestmark = pytest.mark.django_db

DELETE = "project/main/fleets/delete_instances"


def live(fleet_name: str, project: str = "main") -> list[int]:
    return sorted(Instance.objects.filter(project__name=project, fleet__name=fleet_name)
                  .exclude(status=InstanceStatus.TERMINATED).values_list("index", flat=True))


def test_the_chosen_hosts_leave_the_fleet_and_the_rest_stay(alice):
    small_fleet()
    answer = post(alice, DELETE, {"name": "small", "instance_nums": [1]})
    assert answer.status_code == 200 and answer.json() is None, answer.content
    assert live("small") == [0]
    shown = post(alice, "project/main/fleets/get", {"name": "small"}).json()
    assert [i["instance_num"] for i in shown["instances"]] == [0]


def test_a_host_that_runs_a_job_keeps_every_chosen_host(alice):
    small_fleet()
    Instance.objects.filter(name="small-1").update(status=InstanceStatus.BUSY)
    msg = one_detail(post(alice, DELETE, {"name": "small", "instance_nums": [0, 1]}), 400, "error")
    assert "Failed to delete fleet small instances [0, 1]. Fleet instances are in use" in msg and "small-1" in msg
    assert live("small") == [0, 1]


def test_an_index_the_fleet_does_not_have_is_named_and_nothing_is_deleted(alice):
    small_fleet()
    msg = one_detail(post(alice, DELETE, {"name": "small", "instance_nums": [0, 7]}), 400, "error")
    assert "has no instances [7]" in msg and "[0, 1]" in msg, msg
    assert live("small") == [0, 1]


def test_a_fleet_still_registering_its_hosts_is_refused(alice):
    fleet = small_fleet()
    Fleet.objects.filter(pk=fleet.pk).update(status=FleetStatus.PENDING)
    assert "still registering" in one_detail(post(alice, DELETE, {"name": "small", "instance_nums": [0]}), 400, "error")
    assert live("small") == [0, 1]


def test_a_host_of_a_tpu_slice_is_refused_the_slice_is_deleted_whole(alice):
    project = Project.objects.get(name="main")
    fleet = Fleet.objects.create(project=project, name="tpu", backend=FleetBackend.GCP, placement="cluster")
    pod = InstanceGroup.objects.create(project=project, fleet=fleet, name="tpu-pod-1", kind=GroupKind.TPU_POD)
    for i in range(2):
        Instance.objects.create(project=project, fleet=fleet, group=pod, index=i, name=f"tpu-pod-1-{i}",
                                status=InstanceStatus.IDLE, backend=FleetBackend.GCP)
    msg = one_detail(post(alice, "project/main/fleets/delete_instances", {"name": "tpu", "instance_nums": [1]}),
                     400, "error")
    assert "TPU slice tpu-pod-1" in msg and "deleted whole" in msg, msg
    assert live("tpu") == [0, 1]


def test_another_tenants_fleet_of_the_same_name_is_not_touched(alice, make_user):
    small_fleet()
    mallory = dstack_client(make_user("mallory", project="other"))
    small_fleet(project_name="other")  # the same fleet and instance names, in mallory's project
    assert one_detail(post(mallory, DELETE, {"name": "small", "instance_nums": [0]}), 400, "resource_not_exists")
    assert post(mallory, "project/other/fleets/delete_instances",
                {"name": "small", "instance_nums": [0]}).status_code == 200
    assert live("small") == [0, 1] and live("small", "other") == [1]
    assert one_detail(post(alice, DELETE, {"name": "nope", "instance_nums": [0]}), 400, "resource_not_exists")


@pytest.mark.parametrize("body", [{"name": "small", "instance_nums": []}, {"name": "small", "instance_nums": [-1]},
                                  {"name": "small", "instance_nums": ["a"]}, {"name": "small"},
                                  {"name": "small", "instance_nums": [2**40]},
                                  {"name": "small", "instance_nums": list(range(101))}])
def test_bad_instance_nums_are_one_dstack_error(alice, body):
    small_fleet()
    assert "instance_nums" in one_detail(post(alice, DELETE, body), 400, "error")
    assert live("small") == [0, 1]


@pytest.mark.django_db(transaction=True)
def test_the_chosen_hosts_agents_are_stopped_by_a_worker_not_the_request(alice, celery_worker, monkeypatch):
    import threading

    from engine import groups
    from tests.waiting import wait_until

    stopped = []

    def watched(instances):
        stopped.append((threading.current_thread(), sorted(i.index for i in instances)))

    monkeypatch.setattr(groups, "stop_agents", watched)
    small_fleet()
    answer = post(alice, DELETE, {"name": "small", "instance_nums": [1]})
    assert answer.status_code == 200, answer.content
    wait_until(lambda: stopped, 60, "the removed host's agent stopped")
    assert [indexes for _, indexes in stopped] == [[1]]
    assert all(thread is not threading.current_thread() for thread, _ in stopped), "no host I/O in the request"
