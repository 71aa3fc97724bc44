"""Pod rows without hosts or a worker: planning, reserving, polling, and where settings come from.

These call the owning functions directly (no Celery worker: in a non-transactional test the
on_commit enqueues never fire), with the real TPU client against the fake API.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import yaml
from django.utils import timezone

from backends.base import BackendError
from backends.gcp.compute import GcpTpuCompute
from backends.gcp.config import env_settings
from backends.gcp.tpu_client import TpuConfig
from backends.registry import fleet_backend_config, get_compute
from engine import pods
from instances.models import Fleet, InstanceGroup
from muster import crypto
from projects.models import Project
from runs.models import Job
from runs.services.submission import submit_run
from tests.conftest import example
from tests.tpu_e2e.helpers import ZONES, tpu_task

pytestmark = pytest.mark.django_db

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.fixture
def gcp_settings(settings, fast_limits, fake_tpu):
    settings.MUSTER = {**settings.MUSTER, "GCP": {
        "project_id": "test-project", "api_endpoint": fake_tpu.endpoint, "zones": ["settings-zone"],
        "ssh_user": "tpu-admin", "ssh_private_key": KEY, "timeout": 5}}
    return fake_tpu


@pytest.fixture
def fleet(api, gcp_settings) -> Fleet:
    response = api.post("/api/projects/main/fleets/", {"configuration": example("tpu-fleet.yml")}, format="json")
    assert response.status_code == 201, response.content
    return Fleet.objects.get(name="tpu")


def reserve(fleet: Fleet, slice_name: str = "v2-32", name: str = "rows"):
    run = submit_run(Project.objects.get(name="main"), None, {"configuration": tpu_task(name, slice_name)})
    jobs = list(run.current_jobs())
    compute = get_compute("gcp", fleet_backend_config(fleet))
    return jobs, pods.reserve_pod(fleet, compute, jobs)


def test_plan_rejects_nodes_that_disagree_with_the_slice_and_names_the_host_count(api):
    conf = {**yaml.safe_load(example("tpu-v2-32.yml")), "nodes": 2}

    response = api.post("/api/projects/main/runs/plan", {"configuration": conf}, format="json")

    assert response.status_code == 400
    assert "nodes: 4" in response.content.decode()


def test_plan_of_the_example_makes_one_job_per_host(api):
    response = api.post("/api/projects/main/runs/plan", {"configuration": example("tpu-v2-32.yml")},
                        format="json")

    assert response.status_code == 200, response.content
    jobs, groups = response.json()["jobs"], response.json()["configuration"]["groups"]
    assert [j["node_group_rank"] for j in jobs] == [0, 1, 2, 3]
    assert {groups[j["node_group_index"]]["resources"]["gpu"]["tpu"] for j in jobs} == {"v2-32"}


def test_the_fleets_zones_spot_and_runtime_version_reach_the_tpu_api_settings(api, gcp_settings):
    conf = {**yaml.safe_load(example("tpu-fleet.yml")), "spot": True, "runtime_version": "my-image"}
    assert api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json").status_code == 201

    merged = fleet_backend_config(Fleet.objects.get(name="tpu"))
    tpu = TpuConfig.from_dict(merged)

    assert tpu.zones == ZONES, "the fleet's zones win over the server's"
    assert tpu.spot is True
    assert set(tpu.runtime_versions.values()) == {"my-image"}
    assert (tpu.project_id, merged["ssh_user"]) == ("test-project", "tpu-admin")


def test_server_wide_gcp_settings_can_come_from_the_environment(tmp_path):
    key_file = tmp_path / "id"
    key_file.write_text(KEY)

    got = env_settings({"MUSTER_GCP_PROJECT_ID": "p", "MUSTER_GCP_ZONES": "z-a, z-b",
                        "MUSTER_GCP_SSH_PRIVATE_KEY": str(key_file), "MUSTER_GCP_CREDENTIALS": '{"type": "x"}'})

    assert got == {"project_id": "p", "zones": ["z-a", "z-b"], "ssh_private_key": KEY, "credentials": '{"type": "x"}'}


def test_pod_names_are_valid_tpu_node_ids():
    for run, group in [("Run_1", "default"), ("9lives", "g"), ("a" * 80, "default")]:
        name = GcpTpuCompute.group_name(run, group)
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 57, name


def test_reserving_a_slice_points_job_k_at_host_k_before_the_slice_exists(fleet, gcp_settings):
    jobs, assigned = reserve(fleet)

    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    hosts = list(pod.instances.order_by("index"))
    assert [assigned[j.pk] for j in jobs] == [h.pk for h in hosts]
    for job in jobs:
        job.refresh_from_db()
    assert [j.instance_id for j in jobs] == [h.pk for h in hosts], "set in the same transaction as the rows"
    assert {h.status for h in hosts} == {"provisioning"} and pod.status == "provisioning"
    assert {h.holder_id for h in hosts} == {fleet.project_id}, "made for the project's jobs: its hosts already"
    assert gcp_settings.create_calls == [f"projects/test-project/locations/{ZONES[0]}/nodes/{pod.name}"]


def test_polls_turn_the_slice_ready_with_each_worker_on_its_host(fleet, gcp_settings):
    reserve(fleet)
    pod = InstanceGroup.objects.get(kind="tpu_pod")

    assert pods.poll_pod(pod.pk)  # the fake's slice is still CREATING on this look
    pod.refresh_from_db()
    assert pod.status == "provisioning"
    assert pods.poll_pod(pod.pk)

    pod.refresh_from_db()
    hosts = list(pod.instances.order_by("index"))
    assert pod.status == "active"
    assert [h.internal_ip for h in hosts] == [f"10.200.0.{k + 2}" for k in range(4)]
    assert {h.status for h in hosts} == {"busy"}, "their jobs were waiting for them"
    assert {h.holder_id for h in hosts} == {fleet.project_id}
    assert {h.username for h in hosts} == {"tpu-admin"}
    assert {crypto.decrypt(h.private_key_encrypted) for h in hosts} == {KEY}
    assert {h.region for h in hosts} == {ZONES[0]}


def test_an_unreachable_tpu_api_does_not_give_the_slice_up_before_the_limit(fleet, gcp_settings):
    reserve(fleet)
    pod = InstanceGroup.objects.get(kind="tpu_pod")
    gcp_settings.stop()

    assert pods.poll_pod(pod.pk)

    pod.refresh_from_db()
    assert pod.status == "provisioning"
    assert {h.status for h in pod.instances.all()} == {"provisioning"}


def test_a_slice_that_failed_while_creating_is_deleted_and_its_jobs_end(fleet, gcp_settings):
    jobs, _ = reserve(fleet, name="doomed")
    pod = InstanceGroup.objects.get(kind="tpu_pod")
    gcp_settings.set_state(gcp_settings.create_calls[0], "PREEMPTED")

    pods.poll_pod(pod.pk)

    pod.refresh_from_db()
    assert pod.status == "terminating"
    assert {h.status for h in pod.instances.all()} == {"terminating"}
    assert {j.status for j in jobs[0].run.current_jobs()} == {"terminating"}


def test_the_sweep_repolls_a_provisioning_pod_only_once_its_own_polls_have_gone_quiet(fleet, gcp_settings):
    reserve(fleet)
    pod = InstanceGroup.objects.get(kind="tpu_pod")
    pods.poll_pod(pod.pk)
    now = timezone.now()

    assert list(pods.pods_to_poll(now)) == [], "just looked at: its next poll is already queued"
    assert list(pods.pods_to_poll(now + timedelta(minutes=5))) == [pod.pk], "that poll looks lost"


def test_a_pod_with_one_busy_host_is_neither_reused_nor_expired(fleet, gcp_settings):
    reserve(fleet)
    pod = InstanceGroup.objects.get(kind="tpu_pod")
    pods.poll_pod(pod.pk)
    pods.poll_pod(pod.pk)
    Fleet.objects.filter(pk=fleet.pk).update(idle_duration=0)
    pod.instances.exclude(index=2).update(status="idle", idle_since=timezone.now())

    assert pods.expire_idle_pods(timezone.now() + timedelta(days=1)) == 0
    assert pods._reuse_idle_pod(fleet, "v2-32", 4, fleet.project_id) is None
    assert sorted(pod.instances.values_list("status", flat=True)) == ["busy", "idle", "idle", "idle"]

    pod.instances.update(status="idle")
    assert pods.expire_idle_pods(timezone.now() + timedelta(days=1)) == 0, "its jobs still wait for it"
    Job.objects.filter(instance__group=pod).update(status="done")
    assert pods.expire_idle_pods(timezone.now() + timedelta(days=1)) == 1
    pod.refresh_from_db()
    assert pod.status == "terminating"
    assert set(pod.instances.values_list("status", flat=True)) == {"terminating"}
    assert not pod.instances.filter(holder__isnull=False).exists(), "a slice being deleted is nobody's"


def test_the_gcp_backend_says_it_creates_groups_without_any_settings_and_checks_them_on_use(settings):
    settings.MUSTER = {**settings.MUSTER, "GCP": {}}
    compute = get_compute("gcp")

    assert compute.creates_groups is True
    with pytest.raises(BackendError, match="project_id is required"):
        compute.get_offers({"gpu": {"tpu": "v2-32"}})


def test_pod_names_are_the_same_for_one_attempt_and_differ_between_attempts():
    assert GcpTpuCompute.group_name("train", "default", "7/0/0") == GcpTpuCompute.group_name("train", "default", "7/0/0")
    assert GcpTpuCompute.group_name("train", "default", "7/0/0") != GcpTpuCompute.group_name("train", "default", "7/0/1")
    assert GcpTpuCompute.group_name("train", "default", "7/0/0") != GcpTpuCompute.group_name("train", "default", "8/0/0")


@pytest.mark.parametrize("reached_the_api", [True, False])
def test_a_pod_whose_create_outcome_was_never_recorded_is_found_or_made_by_its_node_id(
        fleet, gcp_settings, reached_the_api):
    reserve(fleet)
    pod = InstanceGroup.objects.get(kind="tpu_pod")
    name = f"projects/test-project/locations/{ZONES[0]}/nodes/{pod.name}"
    # The worker died inside the create call: the rows are there, what the call did is not.
    InstanceGroup.objects.filter(pk=pod.pk).update(backend_data={"backend": "gcp"})
    if not reached_the_api:
        gcp_settings.nodes.clear()

    for _ in range(3):
        pods.poll_pod(pod.pk)

    pod.refresh_from_db()
    assert pod.status == "active" and pod.backend_data["node_name"] == name
    assert list(gcp_settings.nodes) == [name]
    assert gcp_settings.create_calls == [name] * (1 if reached_the_api else 2)


def test_reserving_again_for_the_same_attempt_takes_the_planned_pod_and_creates_no_second_slice(
        fleet, gcp_settings):
    jobs, first = reserve(fleet, name="twice")
    compute = get_compute("gcp", fleet_backend_config(fleet))

    again = pods.reserve_pod(fleet, compute, [Job.objects.get(pk=j.pk) for j in jobs])

    assert again == first
    assert InstanceGroup.objects.filter(kind="tpu_pod").count() == 1
    assert len(gcp_settings.create_calls) == 1, "the node the first try made was found by its id"
    assert len(gcp_settings.nodes) == 1


def test_one_watch_tick_lists_each_zone_of_a_fleet_once_whatever_the_number_of_pods(fleet, gcp_settings):
    from engine import pod_watch

    for name in ("one", "two", "three"):
        reserve(fleet, "v4-16", name=name)
    gcp_settings.creation_polls = 0
    for pod in InstanceGroup.objects.filter(kind="tpu_pod"):
        pods.poll_pod(pod.pk)
        pods.poll_pod(pod.pk)
    assert InstanceGroup.objects.filter(kind="tpu_pod", status="active").count() == 3
    mark = len(gcp_settings.calls)

    assert pod_watch.watch_pods() == 3

    calls = gcp_settings.calls[mark:]
    assert calls == [("GET", "/v2/projects/test-project/locations/us-central1-a/nodes")], \
        "one list of the zone for the fleet's three pods, no call per node"
