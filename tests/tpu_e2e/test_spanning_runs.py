"""Runs that span fleets: a CPU router on an SSH fleet and a TPU slice on a gcp fleet, as one run.

Five namespace sshd hosts: four are the v5litepod-16 slice's VMs (the fake TPU API hands their
addresses out as the slice's endpoints), the fifth is the one host of an SSH fleet. The router is
submitted through the `muster` CLI against a live server and reads the slice's addresses from
`${{ groups[1].nodes[j].IP_ADDRESS }}` and DSTACK_NODES_IPS.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from events.models import Event
from instances.models import Instance, InstanceGroup
from runs.models import Job
from runs.services import logs
from tests.conftest import token_for
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import fleet_configuration, post_fleet, settled
from tests.tpu_e2e.helpers import PRINT_ENV, ZONES, env_line, needs_netns

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]
SLICE = "tpu-v5litepod-16"  # 16 chips, 4 hosts
ROUTER = ('echo "router sees slice=${{ groups[1].nodes[0].IP_ADDRESS }},${{ groups[1].nodes[1].IP_ADDRESS }},'
          '${{ groups[1].nodes[2].IP_ADDRESS }},${{ groups[1].nodes[3].IP_ADDRESS }} '
          'nodes=$(echo $DSTACK_NODES_IPS | tr " " ",") me=$DSTACK_NODE_IP"')


@pytest.fixture(scope="module")
def tpu_hosts(ssh_hosts_session):
    """Four slice VMs and one SSH fleet host."""
    return ssh_hosts_session(5, mode="netns")


@pytest.fixture
def fleets(gcp, make_fleet, api, tpu_hosts, celery_worker):
    """The gcp fleet `tpu` (slice VMs: hosts 0-3) and the SSH fleet `routers` (host 4)."""
    gcp.host_addresses = [h.address for h in list(tpu_hosts)[:4]]
    make_fleet()
    router_host = list(tpu_hosts)[4]
    assert post_fleet(api, fleet_configuration(tpu_hosts, "routers", hosts=[router_host])).status_code == 202
    assert settled(api, "routers")["status"] == "active"
    return router_host


@pytest.fixture
def muster(live_server, make_user, tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "MUSTER_URL": live_server.url,
           "MUSTER_TOKEN": token_for(make_user("bob")), "MUSTER_PROJECT": "main"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MUSTER, *args], env=env, capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL)

    return run


def spanning_task(name: str, slice_first: bool = False, **changes) -> dict:
    router = {"name": "router", "nodes": 1, "resources": {"cpu": 1}, "commands": [ROUTER]}
    tpu = {"name": "tpu", "resources": {"gpu": SLICE}, "commands": [PRINT_ENV]}
    if slice_first:  # then the references point at groups[0]
        router["commands"] = [ROUTER.replace("groups[1]", "groups[0]")]
    return {"type": "task", "name": name, "groups": [tpu, router] if slice_first else [router, tpu], **changes}


def write(tmp_path: Path, conf: dict) -> str:
    path = tmp_path / "span.yml"
    path.write_text(yaml.safe_dump(conf))
    return str(path)


@pytest.mark.parametrize("slice_first", [False, True], ids=["router-is-rank-0", "slice-is-rank-0"])
def test_a_router_on_an_ssh_fleet_and_a_slice_on_a_gcp_fleet_run_as_one_run(
        fleets, gcp, muster, tmp_path, celery_worker, slice_first):
    router_host = fleets
    slice_ips = [str(a) for a in gcp.host_addresses]
    path = write(tmp_path, spanning_task("span", slice_first))

    plan = muster("plan", "-f", path)
    assert plan.returncode == 0, plan.stderr
    assert "Fits fleets " in plan.stdout and "(the run spans fleets)" in plan.stdout, plan.stdout
    assert f"  router (fleet routers): {Instance.objects.get(fleet__name='routers').name}" in plan.stdout
    assert "  tpu (fleet tpu): new hosts (the fleet creates them)" in plan.stdout

    applied = muster("apply", "-f", path, "-y")

    run = wait_for_run("span", timeout=120)
    jobs = list(run.current_jobs().select_related("instance", "instance__fleet"))
    assert run.status == "done", ([(j.job_num, j.status, j.termination_message) for j in jobs], applied.stderr)
    assert applied.returncode == 0, applied.stderr
    [router] = [j for j in jobs if j.node_group_name == "router"]
    workers = sorted((j for j in jobs if j.node_group_name == "tpu"), key=lambda j: j.node_group_rank)
    assert router.instance.fleet.name == "routers" and router.instance.internal_ip == str(router_host.address)
    assert {j.instance.fleet.name for j in workers} == {"tpu"} and len(workers) == 4
    said = next(ln for ln in logs.read(router).decode().splitlines() if ln.startswith("router sees"))
    assert f"slice={','.join(slice_ips)}" in said, said  # the slice's internal IPs, written by the router itself
    ranked = [str(router_host.address), *slice_ips] if not slice_first else [*slice_ips, str(router_host.address)]
    assert f"nodes={','.join(ranked)}" in said and f"me={router_host.address}" in said, said
    for k, job in enumerate(workers):
        seen = env_line(logs.read(job).decode())
        assert seen["worker"] == str(k) and seen["ip"] == slice_ips[k] and seen["nodes"] == "5"
        assert seen["hostnames"] == ",".join(slice_ips)
    assert Event.objects.filter(run=run, message__startswith="placed across fleets: ").exists()
    assert len(gcp.create_calls) == 1
    assert set(Instance.objects.filter(fleet__name="routers").values_list("status", flat=True)) == {"idle"}


@pytest.mark.parametrize("how", ["create-refused-in-every-zone", "operation-fails-in-every-zone"])
def test_a_slice_that_cannot_be_had_gives_the_ssh_host_back_in_the_same_step(
        fleets, gcp, api, celery_worker, how):
    if how == "create-refused-in-every-zone":
        gcp.exhausted_zones = set(ZONES)
    else:
        for zone in ZONES:
            gcp.failed_operations[zone] = (8, f'There is no more capacity in the zone "{zone}"')
    answer = api.post("/api/projects/main/runs/", {"configuration": spanning_task("nope")}, format="json")
    assert answer.status_code == 201, answer.content

    run = wait_for_run("nope", timeout=90)

    jobs = {j.node_group_name: j for j in run.current_jobs().select_related("instance") if j.node_group_rank == 0}
    assert run.status == "failed", [(j.job_num, j.status, j.termination_message) for j in run.current_jobs()]
    assert jobs["tpu"].termination_reason == "failed_to_start_due_to_no_capacity"
    router = jobs["router"]
    host = Instance.objects.get(fleet__name="routers")
    # the router held its host while the slice was being made, and gave it back when the slice failed
    assert Event.objects.filter(instance=host, run=run, message__startswith="taken by job nope/0").exists()
    assert (router.status, router.termination_reason) == ("terminated", "terminated_by_server")
    assert router.termination_message.startswith("gang released: tpu: "), router.termination_message
    assert Event.objects.filter(run=run, subject="run nope", message__startswith="gang released: tpu: ").exists()
    given = Event.objects.filter(instance=host, run=run, subject=f"instance {host.name}",
                                 message__contains="gang released: tpu: ")
    assert given.count() == 1 and given.get().status == "idle"
    host.refresh_from_db()
    assert host.status == "idle" and host.unreachable is False
    assert not Job.objects.filter(run=run, runner_submitted=True).exists(), "nothing ran on the SSH host"
    assert not InstanceGroup.objects.filter(kind="tpu_pod").exclude(status__in=["terminating", "terminated"]).exists()
