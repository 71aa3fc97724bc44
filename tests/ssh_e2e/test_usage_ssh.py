"""A job's usage from a real SSH host (a network namespace, its own sshd): the runner samples the
job's processes and the host's nvidia-smi, and the server reads the sample from the status the
watch asks for anyway."""

from __future__ import annotations

import pytest

from runs import usage
from runs.models import Job
from runs.services.submission import submit_run
from runs.transitions import request_stop
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import fleet_configuration, needs_netns, registered_fleet
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]

# the documented CSV of the query the runner makes, for one GPU
NVIDIA_SMI = """#!/bin/sh
case "$*" in *--query-gpu=index,utilization.gpu,memory.used,memory.total*) echo "0, 81, 40000, 46068" ;; *) exit 2 ;; esac
"""
BUSY = "type: task\nname: busy\nfleets: [solo]\ncommands:\n  - while :; do :; done\n"


def test_a_job_on_an_ssh_host_reports_its_cpu_memory_and_the_hosts_gpu(ssh_hosts, project, fast_limits,
                                                                          celery_worker):
    (host,) = ssh_hosts(1, mode="netns")
    registered_fleet(project, {"configuration": fleet_configuration(host.pool, name="solo")}, actor="test")
    script = host.bin_dir / "nvidia-smi"  # first on the host's PATH (tests/sshhosts.py)
    script.write_text(NVIDIA_SMI)
    script.chmod(0o755)
    run = submit_run(project, None, {"configuration": BUSY})

    def sampled():
        job = Job.objects.get(run=run, job_num=0)
        last = usage.latest(job)
        return last if last and last["cpu_percent"] is not None else None

    last = wait_until(sampled, timeout=90, what="a sample with a CPU figure from the SSH host")
    assert last["cpu_percent"] > 0 and last["memory_bytes"] > 0
    assert last["gpus"] == [{"index": 0, "util_percent": 81.0, "memory_used_bytes": 40000 << 20,
                             "memory_total_bytes": 46068 << 20}]
    request_stop(run, actor="test")
    wait_for_run("busy", timeout=60)
