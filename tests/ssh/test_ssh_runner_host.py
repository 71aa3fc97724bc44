"""SSHRunnerHost driving the real runner on namespace SSH hosts."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import time
import uuid
import zipfile
from typing import Any

import pytest

from backends.runner_archive import runner_archive
from backends.ssh.errors import HostUnreachable
from backends.ssh.runner_host import RunnerError, SSHRunnerHost
from tests.sshhosts import SSHHostPool
from tests.waiting import patient, wait_until

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs OpenSSH sshd"),
]


@pytest.fixture(scope="module")
def pool():
    with SSHHostPool(2, mode="netns") as pool:
        yield pool


@pytest.fixture
def runner(pool):
    rh = SSHRunnerHost(pool[0].target(), timeout=20)
    rh.ensure_agent()
    yield rh
    rh.close()


def _wait_for_state(
    rh: SSHRunnerHost, job_id: str, states: tuple[str, ...], timeout: float = 20
) -> dict[str, Any]:
    deadline = time.monotonic() + patient(timeout)
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = rh.status()["jobs"].get(job_id) or {}
        if status.get("state") in states:
            return status
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not reach {states}: {status}")


def _job_id() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


def test_status_of_a_host_without_the_runner_reports_no_agent(pool):
    rh = SSHRunnerHost(pool[1].target(runner_home=str(pool[1].home / "fresh")))
    try:
        status = rh.status()
    finally:
        rh.close()
    assert status["agent"] is None and status["agent_alive"] is False and status["jobs"] == {}


def test_ensure_agent_installs_the_runner_into_the_host_home_once(pool, runner):
    installed = pool[0].muster_home / "bin" / "muster_runner.pyz"
    assert installed.read_bytes() == runner_archive().read_bytes()
    inode = installed.stat().st_ino
    runner.ensure_agent()  # current runner: no upload (an upload would replace the file)
    assert installed.stat().st_ino == inode
    status = runner.status()
    assert status["agent_alive"] is True
    assert status["agent"]["pid"] in pool[0].pids()  # the agent runs inside the host's namespace


def test_a_changed_runner_file_is_uploaded_again(pool, tmp_path):
    changed = tmp_path / "muster_runner.pyz"
    changed.write_bytes(runner_archive().read_bytes())
    with zipfile.ZipFile(changed, "a") as archive:  # still a runnable zipapp, with another checksum
        archive.comment = b"changed"
    home = pool[1].home / "upgrade"
    for path in (runner_archive(), changed):
        rh = SSHRunnerHost(pool[1].target(runner_home=str(home)), runner_path=path)
        try:
            rh.ensure_agent()
        finally:
            rh.close()
        assert (home / "bin" / "muster_runner.pyz").read_bytes() == path.read_bytes()


def test_job_runs_to_done_inside_the_host_namespace(pool, runner):
    host = pool[0]
    job_id = _job_id()
    out = host.home / f"{job_id}.txt"
    spec = {
        "commands": [f'echo "$DSTACK_NODE_IP" > {out}', f"hostname -I >> {out}", "echo hello from the job"],
        "node_ip": host.address,
        "job_num": 0,
        "nodes_num": 1,
    }
    runner.submit(job_id, spec)
    runner.submit(job_id, spec)  # idempotent by job id
    status = _wait_for_state(runner, job_id, ("done", "failed", "terminated"))
    assert status["state"] == "done", status
    node_ip, addresses = out.read_text().splitlines()
    assert node_ip == host.address
    assert addresses.split() == [host.address]  # the job saw only the namespace's network
    log = runner.read_log(job_id)
    assert b"hello from the job" in log
    assert runner.read_log(job_id, offset=len(log) - 4) == log[-4:]
    # the same bytes with the runner's stamps of them, in the one login (runner/log_times.py)
    timed, stamps = runner.read_log_timed(job_id)
    assert timed == log and stamps and stamps[0][0] == 0
    assert all(0 < ms <= time.time() * 1000 for _, ms in stamps), stamps
    runner.cleanup(job_id)
    assert job_id not in runner.status()["jobs"]


def test_job_serves_on_the_host_address_and_stops_on_request(pool, runner):
    host = pool[0]
    job_id = _job_id()
    server = (
        "import socket, os\n"
        "s = socket.create_server((os.environ['DSTACK_NODE_IP'], 9100))\n"
        "print('listening', flush=True)\n"
        "while True:\n"
        "    c, _ = s.accept(); c.sendall(b'served from ' + os.environ['DSTACK_NODE_IP'].encode()); c.close()\n"
    )
    runner.submit(job_id, {"commands": [f"python3 -c {shlex.quote(server)}"], "node_ip": host.address})
    _wait_for_state(runner, job_id, ("running",))
    wait_until(lambda: b"listening" in runner.read_log(job_id), timeout=15, what="the job's server listening")
    # Bound to the host's 10.x address, so it can only be inside the namespace; reached over the bridge.
    with socket.create_connection((host.address, 9100), timeout=5) as conn:
        assert conn.recv(100) == f"served from {host.address}".encode()
    runner.stop(job_id)
    status = _wait_for_state(runner, job_id, ("done", "failed", "terminated"))
    assert status["state"] == "terminated", status
    with pytest.raises(OSError):
        socket.create_connection((host.address, 9100), timeout=2).close()


def test_bad_spec_is_a_runner_error(runner):
    with pytest.raises(RunnerError, match="bad spec"):
        runner.submit(_job_id(), {"commands": "not a list"})


def test_reconnects_after_the_connection_drops_and_restarts_a_killed_agent(pool):
    host = pool[1]
    rh = SSHRunnerHost(host.target(), timeout=20)
    try:
        rh.ensure_agent()
        assert rh.status()["agent_alive"] is True
        # Everything on the host dies but sshd's listener: our session and the agent with it.
        host.kill_processes(keep_sshd=True)
        assert rh.status()["agent_alive"] is False
        rh.ensure_agent()
        assert rh.status()["agent_alive"] is True
    finally:
        rh.close()


def test_unreachable_host_raises_host_unreachable(pool):
    host = pool[1]
    host.stop_sshd()
    try:
        rh = SSHRunnerHost(host.target(), timeout=3)
        with pytest.raises(HostUnreachable, match=host.address):
            rh.status()
        rh.close()
    finally:
        host.start_sshd()


def test_runner_home_with_tilde_is_expanded_on_the_host(pool):
    rh = SSHRunnerHost(pool[1].target(runner_home="~/custom home"))
    try:
        rh.ensure_agent()
        assert rh.status()["agent_alive"] is True
    finally:
        rh.close()
    # HOME of a test host's sessions is the host's directory.
    assert (pool[1].home / "custom home" / "bin" / "muster_runner.pyz").exists()


def _fake_docker(host, body: str) -> None:
    script = host.bin_dir / "docker"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)


def test_a_hung_docker_daemon_is_not_taken_for_no_docker(pool):
    """`docker info` ended by its timeout (124) used to read as "no Docker", and the health check
    then took a host with a slow or restarting daemon out of placement for image jobs."""
    from engine import ssh_health
    from instances import docker_facts
    from instances.models import Instance

    host = pool[1]
    rh = SSHRunnerHost(host.target(), timeout=20)
    try:
        _fake_docker(host, "echo '27.1.0|runc,'")
        assert rh.probe_docker() == {"version": "27.1.0", "runtimes": ["runc"]}
        _fake_docker(host, "exit 124")  # what `timeout 10 docker info` exits with when it kills it
        with pytest.raises(Exception, match="did not answer"):
            rh.probe_docker()
        assert ssh_health._probe_docker(Instance(name="hung", backend_data={}), rh) is docker_facts.UNCHANGED
        _fake_docker(host, "echo 'Cannot connect to the Docker daemon' >&2; exit 1")
        assert rh.probe_docker() is None  # no daemon at all is "no Docker"
    finally:
        (host.bin_dir / "docker").unlink(missing_ok=True)
        rh.close()
