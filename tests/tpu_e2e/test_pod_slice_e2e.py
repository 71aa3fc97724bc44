"""THE end-to-end test: a v2-32 slice (4 hosts) created through the real TPU client, a 4-node task
run on it over SSH, and the pod deleted as one unit through the API by one member's name."""

from __future__ import annotations

import pytest

from instances.models import Instance, InstanceGroup
from runs.services import logs
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import ZONES, env_line, needs_netns, tpu_task
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]


def test_v2_32_slice_runs_one_node_per_host_and_is_deleted_as_one_pod_by_a_member_name(
        gcp, make_fleet, submit, api, celery_worker):
    make_fleet()
    addresses = [str(a) for a in gcp.host_addresses]

    run = wait_for_run(submit(tpu_task("tpu-e2e")), timeout=120)

    jobs = list(run.current_jobs().select_related("instance"))
    assert run.status == "done", [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in jobs]
    assert len(jobs) == 4
    for job in jobs:
        seen = env_line(logs.read(job).decode())
        k = job.job_num
        assert seen["rank"] == str(k)
        assert seen["worker"] == str(k), "TPU_WORKER_ID is the host's index in the slice"
        assert seen["ip"] == addresses[k], f"rank {k} must run on endpoint {k}"
        assert seen["nodes"] == "4"
        assert seen["hostnames"] == ",".join(addresses)
        assert job.instance.index == k and job.instance.internal_ip == addresses[k]
    assert len(gcp.create_calls) == 1
    assert gcp.create_calls[0].startswith(f"projects/test-project/locations/{ZONES[0]}/nodes/")
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert pod.shape == "v2-32" and pod.status == "active"
    assert gcp.create_calls[0].endswith("/" + pod.name)
    assert sorted(pod.instances.values_list("index", flat=True)) == [0, 1, 2, 3]
    assert set(pod.instances.values_list("status", flat=True)) == {"idle"}  # kept for the next run

    listed = api.get("/api/projects/main/instances/").json()
    assert {row["name"] for row in listed} == {f"{pod.name}-{k}" for k in range(4)}

    response = api.delete(f"/api/projects/main/instance-groups/{pod.name}-2/")

    assert response.status_code == 202, response.content
    wait_until(lambda: not Instance.objects.exclude(status="terminated").exists(), 30, "4 terminated hosts")
    assert Instance.objects.filter(group=pod, status="terminated").count() == 4
    assert gcp.delete_calls == [gcp.create_calls[0]]
    pod.refresh_from_db()
    assert pod.status == "terminated"
    assert gcp.nodes == {}


def test_v4_8_is_a_single_host_pod_and_deleting_it_by_pod_name_ends_the_group(
        gcp, make_fleet, submit, api, celery_worker):
    make_fleet()

    run = wait_for_run(submit(tpu_task("tpu-single", "v4-8")), timeout=60)

    [job] = run.current_jobs().select_related("instance")
    assert run.status == "done", (job.status, job.termination_reason, job.termination_message)
    seen = env_line(logs.read(job).decode())
    assert (seen["rank"], seen["worker"], seen["nodes"]) == ("0", "0", "1")
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert pod.shape == "v4-8"
    assert list(pod.instances.values_list("index", "name")) == [(0, f"{pod.name}-0")]
    assert job.instance.group_id == pod.pk

    assert api.delete("/api/projects/main/instance-groups/no-such-pod/").status_code == 404
    response = api.delete(f"/api/projects/main/instance-groups/{pod.name}/")

    assert response.status_code == 202, response.content
    wait_until(lambda: not Instance.objects.exclude(status="terminated").exists(), 30, "the host terminated")
    assert gcp.delete_calls == gcp.create_calls and len(gcp.delete_calls) == 1
    assert api.delete(f"/api/projects/main/instance-groups/{pod.name}/").status_code == 404, "already gone"
