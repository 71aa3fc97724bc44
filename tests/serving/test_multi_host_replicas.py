"""Multi-host replicas (`nodes: 2`) through the REST API with a real worker and the endpoint
process, on local hosts: each replica is two jobs on two hosts with its own rank space, only node 0
is routed to, a node killed restarts its whole replica on the same hosts while the other replica
serves every request, and a replica larger than any fleet is said at plan and at submit; and on
real sshd hosts in network namespaces: a replica's nodes told their hosts, node 0 alone reached."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import requests

from runs.models import Job, Run
from tests.conftest import token_for
from tests.engine.helpers import Beat, local_project_fleet
from tests.engine.service_helpers import describe, replicas, wait_until
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)
from tests.ssh_e2e.helpers import fleet_configuration, needs_netns, registered_fleet

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _yaml(name: str, tmp, port: int, nodes: int = 2) -> str:
    """Every node writes what it was told into `<tmp>/<its address>/`; node 0 serves that directory
    (its `ok` is the probe's), the other node only runs, as a worker of a multi-host model would."""
    return f"""type: service
name: {name}
port: {port}
startup_order: workers-first
groups:
  - name: worker
    replicas: 2
    nodes: {nodes}
    commands:
      - mkdir -p {tmp}/$DSTACK_NODE_IP && cd {tmp}/$DSTACK_NODE_IP
      - echo "$DSTACK_NODE_RANK $DSTACK_NODES_NUM $DSTACK_MASTER_NODE_IP" > cluster
      - cp $DSTACK_MPI_HOSTFILE hostfile && echo $DSTACK_NODE_IP > who && echo ok > ok && echo $$ > pid
      - if [ "$DSTACK_NODE_RANK" = 0 ]; then exec python3 -m http.server {port} --bind $DSTACK_NODE_IP; fi
      - exec sleep 3600
    resources:
      cpu: 1
probes:
  - type: http
    url: /ok
    interval: 1s
    timeout: 1s
retry:
  on_events: [error, interruption]
  duration: 1h
"""


def _units(name: str) -> dict[int, list[Job]]:
    out: dict[int, list[Job]] = {}
    for job in replicas(name):
        out.setdefault(job.replica_num, []).append(job)
    return {k: sorted(v, key=lambda j: j.node_group_rank) for k, v in out.items()}


def _both_ready(name: str):
    units = _units(name)
    heads = [u[0] for u in units.values() if u[0].status == "running" and u[0].ready_at is not None]
    running = all(j.status == "running" for u in units.values() for j in u)
    return len(heads) == 2 and running and units


def test_two_node_replicas_have_their_own_ranks_and_restart_as_one_while_the_other_serves(
        fast_limits, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    local_project_fleet(size=5)  # a spare host: the restart could move, and must not
    port = free_port()
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": _yaml("mh", tmp_path, port)},
                                format="json")
    assert answer.status_code == 201, answer.json()
    assert sorted((j["replica_num"], j["node_group_rank"]) for j in answer.json()["jobs"]) == \
        [(0, 0), (0, 1), (1, 0), (1, 1)], answer.json()["jobs"]
    units = wait_until(lambda: _both_ready("mh"), 90, "two 2-node replicas running, node 0 of each ready")
    assert len({j.instance_id for u in units.values() for j in u}) == 4, describe("mh")
    for unit in units.values():
        head, worker = unit
        ips = [j.instance.internal_ip for j in unit]
        for rank, job in enumerate(unit):
            told = Path(tmp_path) / job.instance.internal_ip
            assert (told / "cluster").read_text().split() == [str(rank), "2", ips[0]], describe("mh")
            assert (told / "hostfile").read_text().split() == ips
        # workers-first: node 0 started only once its worker ran
        assert head.start_time >= worker.start_time, (head.start_time, worker.start_time)
        assert worker.ready_at is not None and head.ready_at is not None
    key = token_for(django_user_model.objects.get(username="root"))
    where, auth = f"{endpoint.url}/proxy/services/main/mh/", {"Authorization": f"Bearer {key}"}
    heads = {u[0].instance.internal_ip for u in units.values()}
    # only node 0 of each replica is routed to: the answers name only heads
    answered = {requests.get(where + "who", headers=auth, timeout=10).content.decode().strip() for _ in range(12)}
    assert answered <= heads and answered, (answered, heads)
    service = superuser_api.get("/api/projects/main/runs/mh/").json().get("service") or {}
    assert service.get("replicas") == {"ready": 2, "total": 2}, service

    victim, other = units[0], units[1]
    os.kill(int((Path(tmp_path) / victim[1].instance.internal_ip / "pid").read_text()), signal.SIGKILL)
    codes, served = [], set()
    with Beat():
        def back():
            got = requests.get(where + "who", headers=auth, timeout=10)
            codes.append(got.status_code)
            served.add(got.content.decode().strip())
            now = _units("mh")
            assert [j.pk for j in now[1]] == [j.pk for j in other], describe("mh")
            fresh = now[0]
            return all(j.submission_num == 1 for j in fresh) and _both_ready("mh")
        wait_until(back, 90, "the replica with the killed node back, both its nodes restarted", every=0.1)
    assert codes and set(codes) == {200}, codes
    assert served <= heads, (served, heads)
    fresh = _units("mh")[0]
    # an error: the same hosts, each node on its own again
    assert [j.instance_id for j in fresh] == [j.instance_id for j in victim], describe("mh")
    old = {j.node_group_rank: Job.objects.get(pk=j.pk) for j in victim}
    assert all(j.superseded for j in old.values())
    assert old[1].termination_reason in ("process_exited_with_error", "executor_error"), old[1]
    assert old[0].termination_reason == "terminated_by_server" and "restarts as one" in \
        old[0].termination_message, old[0].termination_message
    assert all(Job.objects.get(pk=j.pk).status == "running" for j in other)
    assert Run.objects.get(name="mh").status == "running"

    # a replica larger than every fleet: the plan says it fits nowhere; submitted, it fails saying why
    big = _yaml("big", tmp_path, free_port(), nodes=6)
    plan = superuser_api.post("/api/projects/main/runs/plan", {"configuration": big}, format="json")
    assert plan.status_code == 200, plan.content
    assert plan.json()["capacity"]["fits"] is False, plan.json()["capacity"]
    assert superuser_api.post("/api/projects/main/runs/", {"configuration": big}, format="json").status_code == 201
    failed = wait_until(lambda: (r := Run.objects.get(name="big")).finished and r, 30, "the too-large service ends")
    heads_big = [j for j in Job.objects.filter(run=failed, node_group_rank=0)]
    assert any("no 6 idle hosts fit it (nodes: 6) in one fleet" in j.termination_message
               and "none would, even with every host free" in j.termination_message for j in heads_big), \
        [(j.termination_reason, j.termination_message) for j in heads_big]


@needs_netns[0]
@needs_netns[1]
@needs_netns[2]
def test_a_two_node_replica_on_ssh_hosts_is_told_its_hosts_and_only_node_0_is_reached(
        ssh_hosts, fast_limits, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    from projects.models import Project

    pool = ssh_hosts(2, mode="netns")
    project, _ = Project.objects.get_or_create(name="main")
    fleet = registered_fleet(project, {"configuration": fleet_configuration(pool, name="svc")})
    assert fleet.status == "active", fleet.errors
    # one replica of two nodes; node 0 listens on all its host's addresses (the probe knocks on 127.0.0.1)
    conf = _yaml("mh", tmp_path, free_port()).replace("replicas: 2", "replicas: 1").replace(
        "--bind $DSTACK_NODE_IP", "--bind 0.0.0.0") + "fleets: [svc]\n"
    with Beat():
        answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
        assert answer.status_code == 201, answer.json()
        (unit,) = wait_until(lambda: (u := _units("mh")) and all(j.status == "running" for j in u[0])
                             and u[0][0].ready_at and list(u.values()), 120, "the 2-node replica ready")
    ips = [j.instance.internal_ip for j in unit]
    assert sorted(ips) == sorted(h.address for h in pool), "one node on each SSH host"
    for rank, job in enumerate(unit):
        told = Path(tmp_path) / job.instance.internal_ip  # the hosts share this filesystem
        assert (told / "cluster").read_text().split() == [str(rank), "2", ips[0]]
        assert (told / "hostfile").read_text().split() == ips
    key = token_for(django_user_model.objects.get(username="root"))
    where = f"{endpoint.url}/proxy/services/main/mh/who"
    assert {requests.get(where, headers={"Authorization": f"Bearer {key}"}, timeout=30).content.decode().strip()
            for _ in range(8)} == {ips[0]}, "node 0 alone is routed to"
