"""A backend from outside backends/ (tests/fake_cloud), registered by the setting deployments use,
runs a 2-node group and a 2-slice set through the real engine and a real Celery worker: the
engine's group path is any group-creating backend's, with no edit for a new one."""

from __future__ import annotations

import time

import pytest

from engine.groups import terminate_fleet_instances
from instances.models import Fleet, GroupKind, GroupStatus, InstanceGroup
from runs.services.logs import read
from tests.engine.helpers import Beat, wait_for_run
from tests.fake_cloud.compute import NAME
from tests.waiting import patient

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def fake_cloud(settings, fast_limits, api):
    settings.MUSTER = {**settings.MUSTER, "POD_POLL_INTERVAL": 0.3,
                       "EXTRA_BACKENDS": {**settings.MUSTER["EXTRA_BACKENDS"],
                                          NAME: "tests.fake_cloud.compute.FakeCloudCompute"}}
    conf = {"type": "fleet", "name": "fake", "backends": [NAME], "idle_duration": "0s"}
    response = api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json")
    assert response.status_code == 201, response.content
    fleet = Fleet.objects.get(name="fake")
    yield fleet
    terminate_fleet_instances(fleet)


def _run(api, conf: str) -> str:
    response = api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["name"]


def _outputs(run) -> list[str]:
    return [read(job).decode() for job in run.current_jobs().order_by("job_num")]


def test_a_fake_cloud_fleet_is_applied_by_the_registry_as_a_group_creating_fleet(fake_cloud):
    assert fake_cloud.backend == NAME
    assert not fake_cloud.instances.exists(), "its hosts are made when a run needs them"


def test_a_two_node_group_of_the_fake_backend_runs_on_a_group_it_created(fake_cloud, api, celery_worker):
    name = _run(api, "type: task\nname: pair\nnodes: 2\nfleets: [fake]\n"
                     "commands:\n  - echo rank $DSTACK_NODE_RANK of $DSTACK_NODES_NUM at $DSTACK_NODE_IP\n")
    run = wait_for_run(name, timeout=90)
    jobs = list(run.current_jobs().order_by("job_num"))
    assert run.status == "done", [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in jobs]
    group = InstanceGroup.objects.get(fleet=fake_cloud)
    assert (group.kind, group.shape, group.backend_data["backend"]) == (GroupKind.TPU_POD, "2-hosts", NAME)
    assert group.backend_data["polled"], "made by create_group, found ready by poll_group"
    assert [j.instance.group_id for j in jobs] == [group.pk, group.pk]
    assert [j.instance.index for j in jobs] == [0, 1]
    outputs = _outputs(run)
    for rank, (job, text) in enumerate(zip(jobs, outputs, strict=True)):
        assert text == f"rank {rank} of 2 at {job.instance.internal_ip}\n"


def test_a_two_slice_set_of_the_fake_backend_runs_as_one_group(fake_cloud, api, celery_worker):
    with Beat():  # the sweep deletes the set once idle (idle_duration 0)
        name = _run(api, "type: task\nname: sliced\nslices: 2\nfleets: [fake]\nresources:\n  gpu: tpu-v4-16\n"
                         "commands:\n  - echo rank $DSTACK_NODE_RANK of $DSTACK_NODES_NUM\n")
        run = wait_for_run(name, timeout=90)
        group = InstanceGroup.objects.get(fleet=fake_cloud)
        deleted = wait_for_group(group, GroupStatus.TERMINATED)
    jobs = list(run.current_jobs().order_by("job_num"))
    assert run.status == "done", [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in jobs]
    # 2 slices of the 2 hosts a v4-16 has, as one group of 4 hosts that is reused only as a set
    assert (group.shape, group.backend_data["slices"], group.instances.count()) == ("2-hosts", 2, 4)
    assert sorted(j.instance.index for j in jobs) == [0, 1, 2, 3]
    assert _outputs(run) == [f"rank {k} of 4\n" for k in range(4)]
    assert deleted, "idle_duration 0: the set is deleted once idle, by the backend's terminate_group"


def wait_for_group(group, status, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + patient(timeout)
    while time.monotonic() < deadline:
        group.refresh_from_db()
        if group.status == status:
            return True
        time.sleep(0.2)
    return False
