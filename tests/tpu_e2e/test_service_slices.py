"""A service whose replicas are TPU slices, through the REST API with a real worker, the endpoint
process and the fake TPU API (the real google-cloud-tpu client; each slice's hosts are sshd hosts in
network namespaces): two replicas of a v4-16 (2 hosts each) are two queued spot slices, job k of a replica on
host k of its slice told TPU_WORKER_ID k; only worker 0 is reached through the endpoint; a `nodes`
that disagrees with the slice is a 400; one replica's slice preempted is replaced by a new slice
while the other replica serves every request; stopping the service deletes every slice; a replica
whose every worker fails restarts on its own slice after its back-off (no slice deleted and made again)."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import yaml
from google.cloud import tpu_v2

from instances.models import InstanceGroup
from runs.models import Job, Run
from tests.conftest import example, token_for
from tests.engine.service_helpers import describe, replicas, wait_until
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)
from tests.tpu_e2e.helpers import ZONES, needs_netns
from tests.tpu_e2e.test_pod_preemption import node, pod_watch, request  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]

LIVE = (tpu_v2.Node.State.CREATING, tpu_v2.Node.State.READY)


def _service(tmp, port: int, fleet: str = "tpu") -> dict:
    """Every node writes what it was told into `<tmp>/<its address>/`; worker 0 serves that
    directory (its `ok` is the probe's), the other worker only runs, as a model's second host does."""
    return yaml.safe_load(f"""
type: service
name: slices
port: {port}
fleets: [{fleet}]
groups:
  - name: worker
    replicas: 2
    resources: {{gpu: tpu-v4-16}}
    commands:
      - mkdir -p {tmp}/$DSTACK_NODE_IP && cd {tmp}/$DSTACK_NODE_IP
      - echo "$TPU_WORKER_ID $DSTACK_NODE_RANK $DSTACK_NODES_NUM" > told && echo $DSTACK_NODE_IP > who && echo ok > ok
      - if [ "$TPU_WORKER_ID" = 0 ]; then exec python3 -m http.server {port} --bind 0.0.0.0; fi
      - exec sleep 3600
probes:
  - {{type: http, url: /ok, interval: 1s, timeout: 1s}}
retry:
  on_events: [error, interruption]
  duration: 1h
""")


def _units() -> dict[int, list[Job]]:
    out: dict[int, list[Job]] = {}
    for job in replicas("slices"):
        out.setdefault(job.replica_num, []).append(job)
    return {k: sorted(v, key=lambda j: j.node_group_rank) for k, v in out.items()}


def _both_ready():
    units = _units()
    heads = [u[0] for u in units.values() if u[0].ready_at is not None]
    running = len(units) == 2 and all(j.status == "running" for u in units.values() for j in u)
    return len(heads) == 2 and running and units


def test_replicas_are_slices_worker_0_serves_a_preempted_slice_is_replaced_and_stop_deletes_them(
        gcp, superuser_api, celery_worker, beat, pod_watch, endpoint,  # noqa: F811
        django_user_model, tpu_hosts, tmp_path):
    hosts = [h.address for h in tpu_hosts]
    pairs, owner = [hosts[0:2], hosts[2:4]], {}

    def addresses(node_id: str, count: int) -> list[str]:
        # each live slice on two hosts of its own; a new slice takes the pair a deleted one left
        if node_id not in owner:
            live = {owner[n.rsplit("/", 1)[1]] for n, rec in gcp.nodes.items()
                    if rec.node.state in LIVE and n.rsplit("/", 1)[1] in owner}
            owner[node_id] = next(i for i in range(len(pairs)) if i not in live)
        return pairs[owner[node_id]]

    gcp.host_addresses = addresses
    gcp.queued_script[ZONES[0]] = ["CREATING", "ACTIVE"]
    # queued spot slices, kept an hour when idle: a replica's slice goes with its replica all the same
    fleet = {**yaml.safe_load(example("tpu-queued-spot-fleet.yml")), "idle_duration": "1h"}
    assert superuser_api.post("/api/projects/main/fleets/", {"configuration": fleet}, format="json").status_code == 201
    port = free_port()
    conf = _service(tmp_path, port, fleet="tpu-queued")

    wrong = {**conf, "groups": [{**conf["groups"][0], "nodes": 3}]}
    refused = superuser_api.post("/api/projects/main/runs/", {"configuration": wrong}, format="json")
    assert refused.status_code == 400, refused.content
    assert "v4-16 has 2 hosts: set nodes: 2 or leave nodes out" in refused.content.decode(), refused.content

    plan = superuser_api.post("/api/projects/main/runs/plan", {"configuration": conf}, format="json")
    assert plan.status_code == 200, plan.content
    assert plan.json()["capacity"]["fits"] is True and plan.json()["capacity"]["fleet"] == "tpu-queued", plan.json()
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
    assert answer.status_code == 201, answer.json()
    assert sorted((j["replica_num"], j["node_group_rank"]) for j in answer.json()["jobs"]) == \
        [(0, 0), (0, 1), (1, 0), (1, 1)], answer.json()["jobs"]
    units = wait_until(_both_ready, 120, "two slice replicas running, worker 0 of each ready")
    pods = {u[0].instance.group_id for u in units.values()}
    assert len(pods) == 2 and len(gcp.queued_create_calls) == 2, (describe("slices"), gcp.calls)
    for unit in units.values():
        assert {j.instance.group_id for j in unit} == {unit[0].instance.group_id}, "a replica is one slice"
        for rank, job in enumerate(unit):
            assert job.instance.index == rank, "job k on host k"
            told = Path(tmp_path) / job.instance.internal_ip
            assert (told / "told").read_text().split() == [str(rank), str(rank), "2"], describe("slices")
        assert unit[1].ready_at is not None  # (a worker without probes is ready once it runs)

    key = token_for(django_user_model.objects.get(username="root"))
    where, auth = f"{endpoint.url}/proxy/services/main/slices/who", {"Authorization": f"Bearer {key}"}
    heads = {u[0].instance.internal_ip for u in units.values()}
    answered = {requests.get(where, headers=auth, timeout=10).text.strip() for _ in range(12)}
    assert answered == heads, ("only worker 0 of each slice is reached", answered, heads)
    service = superuser_api.get("/api/projects/main/runs/slices/").json().get("service") or {}
    assert service.get("replicas") == {"ready": 2, "total": 2}, service

    victim, other = units[0], units[1]
    lost = InstanceGroup.objects.get(pk=victim[0].instance.group_id)
    gcp.preempt(node(ZONES[0], lost.name))
    codes, served = [], set()

    def replaced():
        got = requests.get(where, headers=auth, timeout=10)
        codes.append(got.status_code)
        served.add(got.text.strip())
        now = _units()
        assert [j.pk for j in now[1]] == [j.pk for j in other], describe("slices")
        return all(j.submission_num == 1 for j in now[0]) and _both_ready()

    units = wait_until(replaced, 120, "the preempted replica back on a new slice", every=0.1)
    assert codes and set(codes) == {200}, codes
    assert served <= heads, (served, heads)
    fresh = units[0]
    assert {j.instance.group_id for j in fresh} - {lost.pk} == {fresh[0].instance.group_id}, "a new slice"
    old = [Job.objects.get(pk=j.pk) for j in victim]
    assert {j.termination_reason for j in old} == {"interrupted_by_no_capacity"}, [j.termination_message for j in old]
    assert all(Job.objects.get(pk=j.pk).status == "running" for j in other)
    assert [(Path(tmp_path) / j.instance.internal_ip / "told").read_text().split()[0] for j in fresh] == ["0", "1"]
    wait_until(lambda: InstanceGroup.objects.get(pk=lost.pk).status == "terminated"
               and node(ZONES[0], lost.name) not in gcp.nodes, 30, "the preempted slice deleted")
    assert (request(ZONES[0], lost.name), True) in gcp.queued_delete_calls, "its suspended request, with force"
    assert len(gcp.queued_create_calls) == 3, ("one new request for the replaced replica", gcp.queued_create_calls)
    assert Run.objects.get(name="slices").status == "running"

    assert superuser_api.post("/api/projects/main/runs/slices/stop", {}, format="json").status_code in (200, 202)
    wait_until(lambda: Run.objects.get(name="slices").finished, 60, "the service stopped")
    wait_until(lambda: not gcp.nodes and not gcp.queued and not InstanceGroup.objects.exclude(
        status="terminated").exists(), 60, "every slice deleted once its replica is gone, though the fleet keeps "
               "idle slices an hour")


def test_a_slice_still_being_made_for_a_stopped_replica_is_deleted_before_it_is_up(
        gcp, make_fleet, superuser_api, celery_worker, beat, tmp_path):
    gcp.stuck_creating = True  # Google takes its time: the slice stays CREATING
    make_fleet(idle_duration="1h")
    conf = _service(tmp_path, free_port())
    conf["groups"][0]["replicas"] = 1
    assert superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    wait_until(lambda: len(gcp.create_calls) == 1, 30, "the replica's slice asked for")
    assert superuser_api.post("/api/projects/main/runs/slices/stop", {}, format="json").status_code in (200, 202)
    wait_until(lambda: Run.objects.get(name="slices").finished, 30, "the service stopped")
    wait_until(lambda: not gcp.nodes and not InstanceGroup.objects.exclude(status="terminated").exists(), 30,
               "the slice nobody waits for deleted while CREATING")
    assert gcp.delete_calls, gcp.calls


def test_a_replica_whose_every_worker_fails_restarts_on_its_slice_not_a_new_one(
        gcp, make_fleet, superuser_api, celery_worker, beat, tmp_path):
    make_fleet()  # its idle slices deleted at once: only the replica's kept hosts keep its slice
    conf = _service(tmp_path, free_port())
    conf["groups"][0]["replicas"] = 1
    conf["groups"][0]["commands"] = [f"echo $TPU_WORKER_ID >> {tmp_path}/tries", "exit 3"]  # a crash loop
    assert superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    first = wait_until(lambda: (u := _units().get(0)) and len(u) == 2 and all(j.instance for j in u) and u, 60,
                       "the replica on its slice")
    slice_id = first[0].instance.group_id

    def again():
        now = _units().get(0) or []
        return len(now) == 2 and all(j.submission_num >= 1 and j.instance_id for j in now) and now

    fresh = wait_until(again, 90, "every worker failed, and after the back-off the replica starts again")
    assert {j.instance.group_id for j in fresh} == {slice_id}, ("on the same slice", describe("slices"))
    assert [j.instance.index for j in fresh] == [0, 1]
    assert len(gcp.create_calls) == 1, ("no slice made again for a crash loop", gcp.calls)
    assert InstanceGroup.objects.get(pk=slice_id).status != "terminated" and not gcp.delete_calls, gcp.calls
    failed = Job.objects.filter(run__name="slices", submission_num=0)
    assert {j.termination_reason for j in failed} == {"process_exited_with_error"}, describe("slices")

    assert superuser_api.post("/api/projects/main/runs/slices/stop", {}, format="json").status_code in (200, 202)
    wait_until(lambda: Run.objects.get(name="slices").finished, 60, "the service stopped")
    wait_until(lambda: not gcp.nodes and not InstanceGroup.objects.exclude(status="terminated").exists(), 60,
               "its slice deleted once the service stopped: nothing kept billed")
