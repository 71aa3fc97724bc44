"""Multislice end to end: `slices: 2` of v4-16 through the API, the real worker creating the set
through the real google-cloud-tpu client against the fake, and the four jobs run on namespace
sshd hosts (slice 0 on hosts 0-1, slice 1 on hosts 2-3), each printing what it was told.
Separately created slices are one gang (all or none); with `queued_resource` the set is one
request with `multislice_params`; a slice of a set taken back takes the whole set with it."""

from __future__ import annotations

from http import HTTPStatus

import pytest
import yaml

from instances.models import LIVE_INSTANCE_STATUSES as LIVE
from instances.models import Instance, InstanceGroup
from runs.models import Job
from runs.services import logs
from tests.conftest import example
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import ZONES, env_line, needs_netns, tpu_task
from tests.tpu_e2e.test_pod_preemption import long_first_time, pod_watch  # noqa: F401 - fixture
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]

PRINT_MEGASCALE = ('echo "slices=$MEGASCALE_NUM_SLICES slice=$MEGASCALE_SLICE_ID '
                   'coordinator=$MEGASCALE_COORDINATOR_ADDRESS"')


@pytest.fixture
def two_slices(gcp):
    """Slice i of a set (node `<pod>-s-<i>`) on hosts 2i and 2i+1; anything else on the first hosts."""
    addresses = [str(a) for a in gcp.host_addresses]

    def place(node_id: str, hosts: int) -> list[str]:
        i = int(node_id.rsplit("-s-", 1)[1]) if "-s-" in node_id else 0
        return addresses[i * hosts:(i + 1) * hosts]

    gcp.host_addresses = place
    return addresses


def node(zone: str, node_id: str) -> str:
    return f"projects/test-project/locations/{zone}/nodes/{node_id}"


def multislice_task(name: str, **changes) -> dict:
    conf = tpu_task(name, "tpu-v4-16", slices=2, **changes)
    conf["commands"] = [*conf["commands"], PRINT_MEGASCALE]
    return conf


def megascale(text: str) -> dict[str, str]:
    line = next(ln for ln in text.splitlines() if ln.startswith("slices="))
    return dict(part.split("=", 1) for part in line.split())


def assert_four_jobs_in_two_slices(run, addresses: list[str]) -> None:
    jobs = list(run.current_jobs().select_related("instance"))
    assert run.status == "done", [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in jobs]
    assert len(jobs) == 4
    for job in sorted(jobs, key=lambda j: j.job_num):
        text = logs.read(job).decode()
        seen, ms = env_line(text), megascale(text)
        k, s = job.job_num, job.job_num // 2
        assert seen["rank"] == str(k), "group rank = slice x hosts + worker"
        assert seen["ip"] == addresses[k], f"rank {k} runs on slice {s}'s worker {k % 2}"
        assert seen["worker"] == str(k % 2), "TPU_WORKER_ID stays within the slice"
        assert seen["hostnames"] == ",".join(addresses[2 * s:2 * s + 2]), "TPU_WORKER_HOSTNAMES: the slice's hosts"
        assert seen["nodes"] == "4", "DSTACK_* cover the whole group"
        assert ms == {"slices": "2", "slice": str(s), "coordinator": f"{addresses[0]}:8081"}, ms


def test_two_v4_16_slices_run_four_jobs_with_megascale_and_in_slice_worker_ids_then_go_as_one_pod(
        gcp, two_slices, make_fleet, submit, api, celery_worker):
    make_fleet()

    run = wait_for_run(submit(multislice_task("ms-direct")), timeout=150)

    assert_four_jobs_in_two_slices(run, two_slices)
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    assert gcp.create_calls == [node(ZONES[0], f"{pod.name}-s-0"), node(ZONES[0], f"{pod.name}-s-1")]
    assert pod.shape == "v4-16" and pod.backend_data["slices"] == 2
    assert sorted(pod.instances.values_list("index", flat=True)) == [0, 1, 2, 3]
    [listed] = api.get("/api/projects/main/instance-groups/").json()
    assert (listed["shape"], listed["slices"], len(listed["instances"])) == ("v4-16", 2, 4)

    response = api.delete(f"/api/projects/main/instance-groups/{pod.name}-3/")

    assert response.status_code == 202, response.content
    wait_until(lambda: not Instance.objects.exclude(status="terminated").exists(), 30, "4 terminated hosts")
    assert sorted(gcp.delete_calls) == sorted(gcp.create_calls), "both slices deleted with the pod"
    assert gcp.nodes == {}


def test_a_queued_multislice_set_is_one_request_with_node_count_two(gcp, two_slices, api, submit, celery_worker):
    gcp.queued_script[ZONES[0]] = ["CREATING", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    conf = yaml.safe_load(example("tpu-queued-spot-fleet.yml"))
    assert api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json").status_code == 201

    run = wait_for_run(submit(multislice_task("ms-queued", fleets=["tpu-queued"])), timeout=150)

    assert_four_jobs_in_two_slices(run, two_slices)
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    name = f"projects/test-project/locations/{ZONES[0]}/queuedResources/{pod.name}"
    assert gcp.queued_create_calls == [name] and gcp.create_calls == [name], "one request, no node create"
    [spec] = gcp.queued[name].qr.tpu.node_spec
    assert (spec.multislice_params.node_count, spec.multislice_params.node_id_prefix) == (2, f"{pod.name}-s")
    assert sorted(gcp.nodes) == [node(ZONES[0], f"{pod.name}-s-{i}") for i in range(2)]
    assert all(gcp.node(n).multislice_node for n in gcp.nodes)
    assert pod.backend_data["queued_resource"] == name


def test_a_set_whose_second_slice_cannot_be_had_deletes_the_first_and_fails_for_capacity(
        gcp, two_slices, make_fleet, submit, celery_worker):
    make_fleet()
    gcp.node_create_errors["-s-1"] = (HTTPStatus.TOO_MANY_REQUESTS, "There is no more capacity in the zone")
    run = wait_for_run(submit(multislice_task("ms-gang")), timeout=90)

    [job0] = [j for j in run.current_jobs() if j.job_num == 0]
    assert run.status == "failed"
    assert job0.termination_reason == "failed_to_start_due_to_no_capacity"
    assert "slice 1 of 2" in job0.termination_message and "all or none" in job0.termination_message
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    first = node(ZONES[0], f"{pod.name}-s-0")
    assert first in gcp.create_calls and first in gcp.delete_calls, "the slice that was made is deleted"
    assert [c for c in gcp.create_calls if c.endswith("-s-1")] == [node(z, f"{pod.name}-s-1") for z in ZONES]
    wait_until(lambda: gcp.nodes == {}, 20, "no slice left")
    wait_until(lambda: not Instance.objects.filter(status__in=LIVE).exists(), 20, "no host left")


def test_one_slice_of_a_running_set_preempted_takes_the_whole_set_and_retry_brings_a_new_set(
        gcp, two_slices, make_fleet, submit, celery_worker, beat, pod_watch):  # noqa: F811
    make_fleet(spot=True)
    conf = long_first_time("ms-preempt", retry={"on_events": ["interruption"], "duration": "10m"})
    name = submit({**conf, "resources": {"gpu": "tpu-v4-16"}, "slices": 2})
    wait_until(lambda: Job.objects.filter(run__name=name, status="running").count() == 4, 90,
               "the four jobs running on the set")
    first = InstanceGroup.objects.get(kind="tpu_pod", status="active")

    gcp.set_state(node(ZONES[0], f"{first.name}-s-1"), "PREEMPTED")

    wait_until(lambda: Job.objects.filter(run__name=name, submission_num=0,
                                          termination_reason="interrupted_by_no_capacity").count() == 4, 30,
               "every job of the set ended as an interruption")
    ended = list(Job.objects.filter(run__name=name, submission_num=0))
    assert all("the whole set goes" in j.termination_message for j in ended), [j.termination_message for j in ended]
    run = wait_for_run(name, timeout=150)
    assert run.status == "done" and run.submission_num == 1, (run.status, run.termination_reason)
    assert {node(ZONES[0], f"{first.name}-s-{i}") for i in range(2)} <= set(gcp.delete_calls), "both slices deleted"
    second = InstanceGroup.objects.exclude(pk=first.pk).get(kind="tpu_pod")
    assert second.backend_data["slices"] == 2
    assert not Instance.objects.filter(group=first).exclude(status="terminated").exists()
