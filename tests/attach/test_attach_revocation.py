"""An attach key belongs to its member: it stops working when they lose access, not when the job
ends, and a host that was down when that happened loses the line when it answers again. Real sshd
host, real worker, OpenSSH's own client."""

from __future__ import annotations

import subprocess

import paramiko
import pytest
from django.apps import apps
from django.contrib.auth import get_user_model

from engine.sweeps import sweep
from projects.models import Membership
from runs.models import Run
from tests.attach.test_attach_key_limits import attached_key, run, ssh
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import needs_netns
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]

REQUEST = b"GET /answer.txt HTTP/1.0\r\n\r\n"


def grants():
    # looked up when used: the behaviour each test checks first fails on code that has no grants
    return apps.get_model("runs", "AttachGrant").objects


def key_accepted(pool, key) -> bool | None:
    """True when sshd takes the key (whatever its forced command then does), False when it refuses
    it, None when the host did not say."""
    done = run(ssh(pool, key, command="8000"), REQUEST)
    if b"Permission denied" in done.stderr:
        return False
    return True if done.returncode in (0, 1, 2) else None


def connect(pool, key):
    host = pool[0]
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(host.address, port=host.port, username=pool.user, key_filename=str(key),
                   look_for_keys=False, allow_agent=False, timeout=10)
    return client.get_transport()


def lose_access(way: str) -> None:
    writer = get_user_model().objects.get(username="writer")
    if way == "membership":
        Membership.objects.filter(user=writer).delete()  # what the admin's member inline does
    elif way == "tokens":
        writer.api_tokens.all().delete()
    else:
        writer.is_active = False
        writer.save()


@pytest.mark.parametrize("way", ["membership", "tokens", "deactivated"])
def test_an_attach_key_stops_working_when_its_member_loses_access(pool, make_user, project, celery_worker,
                                                                 tmp_path, way):
    key = attached_key(pool, make_user, project, tmp_path)
    assert wait_until(lambda: key_accepted(pool, key), timeout=60, what="the key accepted")
    [line] = [x for x in pool.authorized_keys.read_text().splitlines() if "muster-attach-" in x]
    # a connection made before (a `muster attach` still running): its open session and new ones
    wait_until(lambda: b"router says hi" in run(ssh(pool, key, command="8000"), REQUEST).stdout, timeout=90,
               what="the router listening")
    transport = connect(pool, key)
    before = transport.open_session(timeout=10)
    before.exec_command("8000")

    lose_access(way)
    wait_until(lambda: key_accepted(pool, key) is False, timeout=60, what="the key refused")
    wait_until(lambda: before.exit_status_ready() or before.closed, timeout=30, what="the open session ended")
    assert b"Connection refused" not in before.recv_stderr(500)  # it was connected, and was ended
    after = transport.open_session(timeout=10)
    after.exec_command("8000")
    after.sendall(REQUEST)
    assert b"router says hi" not in after.makefile("rb").read() and after.recv_exit_status() == 2
    transport.close()
    assert line.endswith("-writer")  # the line said whose it was
    assert Run.objects.get(name="routed").current_jobs().get().status == "running"  # the job goes on
    assert "muster-attach-" not in pool.authorized_keys.read_text()
    assert not grants().exists()


def test_a_revoke_due_while_the_host_is_down_happens_when_it_answers_again(pool, make_user, project,
                                                                          celery_worker, tmp_path):
    key = attached_key(pool, make_user, project, tmp_path)
    host = pool[0]
    host.stop_sshd()
    try:
        lose_access("membership")
        # the worker's removal cannot reach the host: the line stays, and so does the row saying so
        wait_until(lambda: grants().filter(revoke_due=True, lease_token="").exclude(
            lease_until=None).exists(), timeout=60, what="the revoke backed off")
        assert "muster-attach-" in pool.authorized_keys.read_text()
    finally:
        host.start_sshd()

    def swept():
        sweep()
        return "muster-attach-" not in pool.authorized_keys.read_text() or None
    wait_until(swept, timeout=120, interval=1, what="the sweep to take the line off")
    assert key_accepted(pool, key) is False
    assert not grants().exists()


def test_an_attach_whose_install_lands_after_the_jobs_end_leaves_no_line(pool, make_user, project,
                                                                        celery_worker, tmp_path):
    """The install held up on the host (here: its `touch` of authorized_keys waits for a gate)
    while the run is stopped and its job's end removes the job's lines: the line that lands after
    must not stay. The request answered at once (202): a worker's install step is what waits."""
    host = pool[0]
    gate, waiting = tmp_path / "gate", tmp_path / "waiting"
    real = subprocess.run(["sh", "-c", "command -v touch"], capture_output=True, text=True).stdout.strip()
    (host.bin_dir / "touch").write_text(
        f'#!/bin/sh\ncase "$*" in *authorized_keys*) : > {waiting}; i=0\n'
        f'  while [ ! -e {gate} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done;; esac\nexec {real} "$@"\n')
    (host.bin_dir / "touch").chmod(0o755)

    from runs.services.submission import submit_run
    from tests.attach.conftest import ROUTER
    from tests.attach.test_attach_key_limits import openssh_key
    from tests.conftest import client_for

    submit_run(project, None, {"configuration": ROUTER})
    wait_until(lambda: Run.objects.get(name="routed").current_jobs().filter(status="running").exists(),
               timeout=90, what="the router running")
    _, public = openssh_key(tmp_path)
    writer = client_for(make_user("writer"))
    answer = writer.post("/api/projects/main/runs/routed/attach", {"job": 0, "public_key": public}, format="json")
    assert answer.status_code == 202, answer.content
    try:
        wait_until(waiting.exists, timeout=60, what="the install to reach the host")
        writer.post("/api/projects/main/runs/routed/stop", {"abort": True}, format="json")
        assert wait_for_run("routed", timeout=90).status in ("terminated", "aborted")
    finally:
        gate.touch()
    # the line landed after the job's end and was taken off again, or the install gave up waiting
    # for the host and its grant went with the job: either way the attach is withdrawn
    status = f"/api/projects/main/runs/routed/attach/{answer.json()['id']}"
    wait_until(lambda: writer.get(status).json()["status"] == "withdrawn", timeout=60, what="the attach withdrawn")
    wait_until(lambda: sweep() and not grants().exists(), timeout=60, interval=1, what="the grant's line removed")
    assert "muster-attach-" not in pool.authorized_keys.read_text()
