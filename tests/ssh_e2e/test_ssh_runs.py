"""Runs on a registered SSH fleet, end to end: real sshd hosts, a real Celery worker, the real runner.

The cluster is one CPU host and two hosts whose nvidia-smi reports 2 x L40S, each in its own network
namespace with its own address, so every node below listens on and connects to real addresses.
"""

from __future__ import annotations

import pytest

from instances.models import Instance
from runs.models import Job
from runs.services import logs
from runs.services.submission import submit_run
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import (
    L40S,
    Beat,
    break_python,
    fleet_configuration,
    host_commands,
    needs_netns,
    registered_fleet,
    runner_processes,
)
from tests.waiting import job_states, wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Every node prints its cluster environment and MPI hostfile into its log, line-prefixed for parsing.
ENV_DUMP = """env | grep -E '^(DSTACK|TPU)_' | sort | sed 's/^/ENV /'
        echo "NODES_IPS $(echo "$DSTACK_NODES_IPS" | paste -sd, -)"
        sed 's/^/HOSTFILE /' "$DSTACK_MPI_HOSTFILE"
"""

# examples/pd-disagg.yml made runnable here: the workers serve a file over HTTP on port 8000 at
# their own address; the router (master, started last) fetches from both through the interpolated
# addresses. master-done stops the servers once the router is through.
PD_RUN = """
type: task
name: pd-ssh
fleets: [pd]
startup_order: workers-first
stop_criteria: master-done
groups:
  - name: router
    nodes: 1
    resources: {cpu: 1}
    commands:
      - |
        __ENV_DUMP__
      - |
        for role in prefill decode; do
          if [ $role = prefill ]; then ip=${{ groups[1].nodes[0].IP_ADDRESS }}; else ip=${{ groups[2].nodes[0].IP_ADDRESS }}; fi
          for i in $(seq 50); do
            out=$(python3 -c "import urllib.request; print(urllib.request.urlopen('http://$ip:8000/role.txt', timeout=2).read().decode().strip())" 2>/dev/null) && break
            sleep 0.2
          done
          echo "router got from $role at $ip:8000: $out"
          [ -n "$out" ]
        done
  - name: prefill
    nodes: 1
    resources: {gpu: "L40S:2"}
    commands:
      - |
        __ENV_DUMP__
      - echo "prefill worker $DSTACK_NODE_RANK of $DSTACK_NODES_NUM at $DSTACK_NODE_IP" > role.txt
      - python3 -m http.server 8000 --bind $DSTACK_NODE_IP
  - name: decode
    nodes: 1
    resources: {gpu: "L40S:2"}
    commands:
      - |
        __ENV_DUMP__
      - echo "decode worker $DSTACK_NODE_RANK of $DSTACK_NODES_NUM at $DSTACK_NODE_IP" > role.txt
      - python3 -m http.server 8000 --bind $DSTACK_NODE_IP
""".replace("__ENV_DUMP__", ENV_DUMP.strip())

SLEEPERS = """
type: task
name: sleepers
fleets: [pd]
nodes: 3
commands:
  - echo "node $DSTACK_NODE_RANK up"
  - sleep 300
"""


@pytest.fixture
def project(fast_limits):
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    return project


@pytest.fixture
def cluster(ssh_hosts, project):
    pool = ssh_hosts(3, gpus=[[], [L40S, L40S], [L40S, L40S]], mode="netns")
    fleet = registered_fleet(project, {"configuration": fleet_configuration(pool)}, actor="test")
    return pool, fleet


@pytest.fixture
def beat(celery_worker):
    with Beat() as beat:
        yield beat


def submit(project, text: str):
    return submit_run(project, None, {"configuration": text})


def env_of(log: str) -> dict[str, str]:
    return dict(line[4:].split("=", 1) for line in log.splitlines() if line.startswith("ENV ") and "=" in line)


def hostfile_of(log: str) -> list[str]:
    return [line[9:] for line in log.splitlines() if line.startswith("HOSTFILE ")]


def test_pd_run_places_groups_by_resources_and_wires_the_router_to_both_workers(cluster, project, beat):
    pool, fleet = cluster
    cpu_host, gpu_a, gpu_b = pool
    run = wait_for_run(submit(project, PD_RUN).name, timeout=90)
    jobs = list(run.current_jobs().select_related("instance"))
    assert run.status == "done", job_states(run)
    router, prefill, decode = jobs

    assert router.instance.internal_ip == cpu_host.address, "the CPU router lands on the CPU host"
    assert {prefill.instance.internal_ip, decode.instance.internal_ip} == {gpu_a.address, gpu_b.address}
    assert jobs[0].start_time > max(prefill.start_time, decode.start_time), "workers-first: the router starts last"

    router_log = logs.read(router).decode()
    assert f"router got from prefill at {prefill.instance.internal_ip}:8000: prefill worker 1 of 3 at " \
           f"{prefill.instance.internal_ip}" in router_log
    assert f"router got from decode at {decode.instance.internal_ip}:8000: decode worker 2 of 3 at " \
           f"{decode.instance.internal_ip}" in router_log

    ips = [j.instance.internal_ip for j in jobs]
    for job, group_name, gpus in ((router, "router", 0), (prefill, "prefill", 2), (decode, "decode", 2)):
        log = logs.read(job).decode()
        env = env_of(log)
        assert env["DSTACK_NODE_RANK"] == str(job.job_num)
        assert env["DSTACK_JOB_NUM"] == str(job.job_num)
        assert env["DSTACK_NODES_NUM"] == "3"
        assert env["DSTACK_GPUS_NUM"] == "4"
        assert env["DSTACK_GPUS_PER_NODE"] == str(gpus)
        assert env["DSTACK_NODE_IP"] == job.instance.internal_ip, "each node sees its own namespace address"
        assert env["DSTACK_MASTER_NODE_IP"] == cpu_host.address
        assert env["DSTACK_NODE_GROUP_NAME"] == group_name
        assert env["DSTACK_NODE_GROUP_INDEX"] == str(job.job_num)
        assert env["DSTACK_NODE_GROUP_RANK"] == "0"
        assert env["DSTACK_RUN_NAME"] == "pd-ssh"
        assert f"NODES_IPS {','.join(ips)}" in log, "DSTACK_NODES_IPS lists every node in rank order"
        assert hostfile_of(log) == [ips[0], f"{ips[1]} slots=2", f"{ips[2]} slots=2"], "CPU nodes have no slots"
        assert not any(k.startswith("TPU_") for k in env)

    assert not Instance.objects.filter(status="busy").exists()
    assert set(fleet.instances.values_list("status", flat=True)) == {"idle"}


def test_deleting_an_ssh_fleet_stops_the_runner_agents_and_terminates_its_instances(cluster, project):
    from tests.ssh_e2e.helpers import deleted_fleet

    pool, fleet = cluster
    assert all(runner_processes(host) for host in pool), "registration started an agent on every host"
    deleted_fleet(fleet, actor="test")
    for host in pool:
        # the agent is waited for, its job runners exit on their own a moment later
        wait_until(lambda host=host: runner_processes(host) == [], timeout=20,
                   what=f"no muster_runner process left on {host}")
    assert set(Instance.objects.filter(name__startswith="pd-").values_list("status", flat=True)) == {"terminated"}


def test_force_deleting_a_fleet_under_a_run_stops_the_jobs_on_its_hosts(cluster, project, beat):
    from tests.ssh_e2e.helpers import deleted_fleet

    pool, fleet = cluster
    run = submit(project, SLEEPERS)
    wait_until(lambda: all(j.status == "running" for j in run.current_jobs()), 60, "all three nodes running")
    deleted_fleet(fleet, force=True, actor="test")

    # a loaded 2-core machine stops three SSH hosts' jobs in well over 30 s at times
    run = wait_for_run(run.name, timeout=90)
    assert run.status == "terminated", job_states(run)
    assert {j.termination_reason for j in run.current_jobs()} == {"terminated_by_server"}
    for host in pool:
        wait_until(lambda h=host: not runner_processes(h) and not any("sleep" in c for c in host_commands(h)),
                   60, f"{host} to have no runner or job processes")
    assert set(Instance.objects.filter(name__startswith="pd-").values_list("status", flat=True)) == {"terminated"}


def test_a_host_that_vanishes_mid_run_fails_its_job_as_unreachable_and_tears_the_run_down(
        cluster, project, beat):
    pool, fleet = cluster
    run = submit(project, SLEEPERS)
    wait_until(lambda: all(j.status == "running" for j in run.current_jobs()), 60, "all three nodes running")
    victim = pool[2]
    lost = Job.objects.get(run=run, instance__hostname=victim.address)
    victim.stop_sshd()
    victim.kill_processes()

    run = wait_for_run(run.name, timeout=60)
    assert run.status == "failed", job_states(run)
    lost.refresh_from_db()
    assert (lost.status, lost.termination_reason) == ("failed", "instance_unreachable"), job_states(run)
    others = run.current_jobs().exclude(pk=lost.pk)
    assert all(j.status == "terminated" and j.termination_reason == "terminated_by_server" for j in others), \
        job_states(run)
    assert not Instance.objects.filter(status="busy").exists()
    assert Instance.objects.get(pk=lost.instance_id).unreachable
    for host in pool[:2]:
        wait_until(lambda h=host: not any(" job " in p for p in runner_processes(h)), 20,
                   f"the job runner on {host} to stop")


def test_a_peer_whose_runner_never_comes_up_fails_with_waiting_runner_limit_exceeded(
        cluster, project, settings, beat):
    settings.MUSTER = {**settings.MUSTER, "WAITING_RUNNER_LIMIT": 4}
    pool, fleet = cluster
    broken = pool[1]
    broken.kill_processes(keep_sshd=True)  # the agent that registration started
    break_python(broken)

    run = wait_for_run(submit(project, SLEEPERS).name, timeout=60)
    assert run.status == "failed", job_states(run)
    stuck = Job.objects.get(run=run, instance__hostname=broken.address)
    assert (stuck.status, stuck.termination_reason) == ("failed", "waiting_runner_limit_exceeded"), job_states(run)
    assert run.termination_reason == "job_failed"
    assert not Instance.objects.filter(status="busy").exists()
