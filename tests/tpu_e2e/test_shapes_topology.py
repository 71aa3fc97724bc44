"""tpu7x (Ironwood) slices and explicit topologies, end to end: the real TPU client against the
fake TPU API, the hosts namespace sshd hosts, the runs submitted through the REST API."""

from __future__ import annotations

import pytest
from google.cloud import tpu_v2

from instances.models import InstanceGroup
from runs.services import logs
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import env_line, needs_netns, tpu_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]


def _created_node(gcp) -> tpu_v2.Node:
    [name] = gcp.create_calls
    node = gcp.node(name)
    assert node is not None, name
    return node


def _ranks(run) -> list[tuple[str, str, str]]:
    jobs = list(run.current_jobs())
    assert run.status == "done", [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in jobs]
    return sorted((env_line(logs.read(j).decode())["rank"], env_line(logs.read(j).decode())["worker"],
                   env_line(logs.read(j).decode())["nodes"]) for j in jobs)


def test_a_tpu7x_slice_has_its_hosts_and_the_fleets_runtime_version(gcp, make_fleet, submit, celery_worker):
    make_fleet(runtime_version="v2-alpha-tpu7x-fleet")

    run = wait_for_run(submit(tpu_task("ironwood", "tpu7x-16")), timeout=90)

    # tpu7x-16: 16 TensorCores = 8 chips, 4 per VM -> 2 hosts, one node each.
    assert _ranks(run) == [("0", "0", "2"), ("1", "1", "2")]
    node = _created_node(gcp)
    assert node.accelerator_type == "tpu7x-16"
    assert node.runtime_version == "v2-alpha-tpu7x-fleet"
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert pod.shape == "tpu7x-16"
    assert set(pod.instances.values_list("resources__tpu_chips", flat=True)) == {4}


def test_an_explicit_topology_becomes_the_accelerator_config_and_decides_the_hosts(
        gcp, make_fleet, submit, api, celery_worker):
    make_fleet()
    task = tpu_task("topo", resources={"gpu": {"name": "tpu-v5litepod", "topology": "4x4"}})

    plan = api.post("/api/projects/main/runs/plan", {"configuration": task}, format="json")
    run = wait_for_run(submit(task), timeout=90)

    assert plan.status_code == 200, plan.content
    # 4x4 = 16 v5e chips, 4 per host in a multi-host slice -> 4 nodes.
    assert _ranks(run) == [(str(k), str(k), "4") for k in range(4)]
    node = _created_node(gcp)
    assert node.accelerator_type == ""
    assert node.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V5LITE_POD
    assert node.accelerator_config.topology == "4x4"
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert pod.shape == "v5litepod-16@4x4"


@pytest.mark.parametrize(("gpu", "said"), [
    ({"name": "tpu-v5litepod", "topology": "4x4x4"}, "v5litepod topologies have 2 sides"),
    ({"name": "tpu-v5litepod-32", "topology": "4x4"}, "topology 4x4 has 16 chips, but v5litepod-32 has 32"),
    ({"name": "tpu-v4", "topology": "3x4x4"}, "power of two"),
    ({"name": "tpu7x", "topology": "2x2x2"}, "tpu7x slices cannot be asked for by topology"),
])
def test_a_topology_that_does_not_fit_the_type_is_a_400_naming_the_field(api, gpu, said):
    task = tpu_task("bad-topo", resources={"gpu": gpu})

    response = api.post("/api/projects/main/runs/", {"configuration": task}, format="json")

    assert response.status_code == 400, response.content
    text = response.content.decode()
    assert "topology" in text and said in text, text
