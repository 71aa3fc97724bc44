"""A TPU slice (the real google-cloud-tpu client against tests/fake_tpu/) whose hosts run Docker:
a task with `image` runs privileged containers, host k runs rank k with TPU_WORKER_ID = k."""

from __future__ import annotations

import re

import pytest
import yaml

from runs.services import logs
from tests.conftest import example
from tests.containers.docker_env import needs_docker
from tests.engine.helpers import wait_for_run
from tests.waiting import wait_until

pytestmark = [*needs_docker, pytest.mark.django_db(transaction=True)]

CAP_SYS_ADMIN = 21  # not among Docker's default capabilities; every capability with --privileged


@pytest.fixture
def gcp(settings, fast_limits, fake_tpu, docker_cluster):
    hosts = list(docker_cluster.pool)[:2]  # a v4-16 slice has two hosts
    fake_tpu.host_addresses = [h.address for h in hosts]
    settings.MUSTER = {
        **settings.MUSTER,
        "GCP": {"project_id": "test-project", "api_endpoint": fake_tpu.endpoint, "zones": ["settings-zone-only"],
                "ssh_user": docker_cluster.pool.user, "ssh_private_key": docker_cluster.pool.private_key,
                "timeout": 5},
        "POD_POLL_INTERVAL": 0.3,
    }
    return hosts


def test_a_tpu_slice_runs_privileged_containers_one_per_host_in_worker_order(
        docker_cluster, gcp, api, celery_worker):
    resp = api.post("/api/projects/main/fleets/", {"configuration": yaml.safe_load(example("tpu-fleet.yml"))},
                    format="json")
    assert resp.status_code == 201, resp.content
    image = docker_cluster.push("tpu", "tpu-image")
    # The test hosts' daemons start privileged containers even where this machine's capability
    # bounding set is short (tests/bounded_runc.py); a machine that refuses them all the same
    # (no user namespaces, a seccomp or LSM policy against them) cannot run this test.
    refused = docker_cluster.privileged_refused(image)
    if refused:
        docker_cluster.forget(image)
        pytest.skip(f"this machine cannot run privileged containers: {refused}")
    run = {"type": "task", "name": "tpu-containers", "fleets": ["tpu"], "image": image,
           "resources": {"gpu": "tpu-v4-16"},
           "commands": ['echo "rank=$DSTACK_NODE_RANK worker=$TPU_WORKER_ID ip=$DSTACK_NODE_IP '
                        'marker=$(cat /etc/test-image-marker) caps=$(sed -n s/^CapEff:.//p /proc/self/status)"',
                        "ip -4 -o addr show eth0 | sed 's/^/ADDR /'",
                        # held until the test has looked at the container from the host
                        "i=0; while [ ! -e /tmp/go ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done"]}
    resp = api.post("/api/projects/main/runs/", {"configuration": run}, format="json")
    assert resp.status_code == 201, resp.content
    for host in gcp:
        [name] = wait_until(host.containers, 120, f"the job's container on {host.name}")
        # `docker ps -a` lists a container from its creation; exec needs it started
        wait_until(lambda h=host, n=name: h.docker("inspect", "--format", "{{.State.Status}}", n).stdout.strip()
                   != "created", 60, f"the job's container on {host.name} started")
        inspected = host.docker("inspect", "--format", "{{.HostConfig.Privileged}} {{.HostConfig.NetworkMode}}",
                                name).stdout.split()
        assert inspected == ["true", "host"], f"privileged, with the host's network: {inspected}"
        host.docker("exec", name, "touch", "/tmp/go")
    done = wait_for_run("tpu-containers", timeout=120)
    jobs = list(done.current_jobs().select_related("instance"))
    assert done.status == "done", [(j.job_num, j.status, j.termination_reason, logs.read(j)[-500:]) for j in jobs]
    assert len(jobs) == 2
    for k, job in enumerate(jobs):
        assert job.instance.internal_ip == gcp[k].address, "worker k of the slice is host k"
        log = logs.read(job).decode()
        [line] = [ln for ln in log.splitlines() if ln.startswith("rank=")]
        seen = dict(re.findall(r"(\w+)=(\S*)", line))
        assert (seen["rank"], seen["worker"], seen["ip"]) == (str(k), str(k), gcp[k].address), line
        assert seen["marker"] == "tpu-image", "the commands ran in the image"
        assert int(seen["caps"], 16) >> CAP_SYS_ADMIN & 1, f"the container is privileged: {line}"
        assert f" inet {gcp[k].address}/" in log, f"the container has the host's network: {log[-500:]}"
    wait_until(lambda: docker_cluster.leftover_containers() == {}, 30, "no container left on the TPU hosts")
    docker_cluster.forget(image)
