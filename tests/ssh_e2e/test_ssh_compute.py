"""The ssh backend's Compute and the runner-agent stop that fleet deletion relies on, on a real host."""

from __future__ import annotations

import time

import pytest

from backends.base import BackendError
from backends.registry import get_compute
from backends.ssh.compute import SSHCompute
from backends.ssh.errors import HostUnreachable
from backends.ssh.runner_host import SSHRunnerHost
from instances.models import Instance
from tests.ssh_e2e.helpers import (
    fleet_configuration,
    host_commands,
    needs_netns,
    registered_fleet,
    runner_processes,
)
from tests.waiting import patient

pytestmark = needs_netns


def wait_until(check, timeout: float = 15) -> bool:
    deadline = time.monotonic() + patient(timeout)
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_ssh_fleets_have_no_offers_and_cannot_create_machines():
    compute = get_compute("ssh")
    assert isinstance(compute, SSHCompute)
    assert compute.get_offers({}) == []
    with pytest.raises(BackendError, match="add hosts"):
        compute.create_instances(None, 1, ["x"])


def test_stop_agent_stops_a_running_job_and_then_the_agent(ssh_hosts):
    host = ssh_hosts(1, mode="netns")[0]
    runner = SSHRunnerHost(host.target(), timeout=10)
    try:
        runner.ensure_agent()
        runner.submit("job-sleeper", {"commands": ["sleep 300"], "node_ip": host.address})
        assert wait_until(lambda: any(c.startswith("sleep 300") for c in host_commands(host)))
        runner.stop_agent()
        assert runner.status()["agent_alive"] is False
        # The job runs in a session of its own, so stopping the agent alone would leave it running.
        assert wait_until(lambda: not runner_processes(host) and not any("sleep" in c for c in host_commands(host)))
        assert runner.status()["jobs"]["job-sleeper"]["state"] == "terminated"
    finally:
        runner.close()


def test_a_look_after_the_agent_was_stopped_for_good_does_not_start_it_again(ssh_hosts):
    """A fleet deleted under a run stops its hosts' agents while a watch may be looking at a job
    there; that look used to find the agent down and start it again, leaving it on the host."""
    from engine.running.observe import look

    host = ssh_hosts(1, mode="netns")[0]
    runner = SSHRunnerHost(host.target(), timeout=10)
    try:
        runner.ensure_agent()
        runner.stop_agent()
        assert wait_until(lambda: not runner_processes(host))
        status, error = look(SSHRunnerHost(host.target(), timeout=10))
        assert status is None and isinstance(error, BackendError) and "retired" in str(error)
        time.sleep(1)
        assert not runner_processes(host), "the look started the stopped agent again"
        runner.ensure_agent(revive=True)  # registering the host again may
        assert runner.status()["agent_alive"] is True
    finally:
        runner.close()


def test_stop_agent_on_a_host_without_the_runner_is_a_no_op(ssh_hosts):
    host = ssh_hosts(1, mode="netns")[0]
    runner = SSHRunnerHost(host.target(runner_home=str(host.home / "never-used")), timeout=10)
    try:
        runner.stop_agent()
    finally:
        runner.close()


def test_the_runner_host_of_an_ssh_instance_reaches_it_and_notices_a_dead_host_as_a_backend_error(
        ssh_hosts, project):
    pool = ssh_hosts(1, mode="netns")
    registered_fleet(project, {"configuration": fleet_configuration(pool, placement="any")})
    inst = Instance.objects.get(name="pd-0")
    runner = get_compute("ssh").runner_host(inst)
    try:
        assert runner.timeout <= 10
        assert runner.status()["agent_alive"] is True
    finally:
        runner.close()
    pool[0].stop_sshd()
    runner = get_compute("ssh").runner_host(inst)
    started = time.monotonic()
    try:
        # The engine catches BackendError around every runner call; an unreachable host must be one.
        with pytest.raises(BackendError) as caught:
            runner.status()
        assert isinstance(caught.value, HostUnreachable)
        assert caught.value.reason == "instance_unreachable"
        assert time.monotonic() - started < 10
    finally:
        runner.close()
