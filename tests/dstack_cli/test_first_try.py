# ruff: noqa: F811 - pytest injects the fixtures imported from test_gateway by parameter name
"""A newcomer's first try with the stock dstack CLI, as README says it: `make run`'s admin token,
README's own `dstack project add` line and nothing else (a fresh HOME, an empty ~/.ssh), then an
attached `dstack apply` of a task on the local fleet `make run` made, which must find the fleet
(the local fleet takes the superuser's runs, the plan must say so too) and print the job's output
through the SSH gateway without any known_hosts step."""

from __future__ import annotations

import io
import os
import re
import subprocess

import paramiko
import pytest
import yaml

from dstack_api.gateway import server
from dstack_api.services import gateway as rules
from dstack_api.services import keys
from instances.services.fleets import create_local_fleet
from projects.models import Project
from runs.models import Job, Run
from tests.conftest import client_for, token_for
from tests.dstack_cli.helpers import DSTACK, ROOT, dstack_runner
from tests.dstack_cli.test_gateway import base, gateway, own_ssh_dir  # noqa: F401 - fixtures
from tests.waiting import wait_until

pytestmark = [pytest.mark.dstack_cli, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def admin(make_user, fast_limits, settings):
    """`make run`'s admin: a superuser, the only one a local fleet takes runs from by default."""
    settings.MUSTER = {**settings.MUSTER, "LOCAL_FLEET_MEMBERS": False}
    user = make_user("admin")
    user.is_superuser = user.is_staff = True
    user.save()
    fleet = create_local_fleet(Project.objects.get(name="main"), "local", 2, placement="cluster")
    yield user
    from engine.groups import terminate_fleet_instances

    terminate_fleet_instances(fleet)


def readme_project_add() -> str:
    """README's `dstack project add` line, as a user copies it."""
    found = re.search(r"^(dstack project add [^#\n]*?)\s*(#.*)?$", (ROOT / "README.md").read_text(), re.M)
    assert found, "README shows no `dstack project add` line"
    return found.group(1)


def test_readme_project_add_then_attached_apply_prints_the_jobs_output(live_server, admin, celery_worker, gateway,
                                                                        base):
    home = base / "dstack-home"
    (home / ".cache" / ".dstack" / "cli").mkdir(parents=True)
    (home / ".cache" / ".dstack" / "cli" / "last_check").touch()  # no PyPI version check
    ssh_dir = home / ".ssh"
    prefix = own_ssh_dir(base)  # the passwd home's ~/.ssh is this empty directory for the CLI and ssh
    assert not any(ssh_dir.iterdir())
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSTACK_")}
    env.update({"HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200", "TERM": "dumb", "TOKEN": token_for(admin),
                "PATH": f"{DSTACK.parent}:{env.get('PATH', '')}"})

    command = readme_project_add().replace("http://127.0.0.1:8000", live_server.url)
    added = subprocess.run([*prefix, "sh", "-c", command], env=env, cwd=base, capture_output=True, text=True,
                           timeout=120)
    assert added.returncode == 0, (command, added.stdout, added.stderr)

    (base / "task.yml").write_text(yaml.safe_dump({
        "type": "task", "name": "first-try",
        "commands": ["echo hello from the first try", "echo second line here"]}))
    planned = subprocess.run([*prefix, str(DSTACK), "apply", "-f", "task.yml", "-y"], env=env, cwd=base,
                             capture_output=True, text=True, timeout=240)
    out = planned.stdout + planned.stderr
    assert "No matching instance offers" not in out, out
    assert planned.returncode == 0, out
    assert "hello from the first try" in planned.stdout and "second line here" in planned.stdout, out
    assert Run.objects.get(name="first-try").status == "done"
    # dstack's CLI includes its own ssh config from ~/.ssh/config; no host key was asked for or kept
    assert not {p.name for p in ssh_dir.iterdir()} - {"config", "config.lock"}, list(ssh_dir.iterdir())


def test_the_plan_offers_the_local_fleet_to_its_superuser(live_server, admin, base):
    dstack = dstack_runner(base, live_server.url, token_for(admin))
    (base / "task.yml").write_text(yaml.safe_dump({"type": "task", "name": "planned", "commands": ["true"]}))
    plan = dstack("apply", "-f", "task.yml", "-y", "-d")
    out = plan.stdout + plan.stderr
    assert "No matching instance offers" not in out, out
    assert re.search(r"^\s*1\s+ssh \(local\)", out, re.M), out  # the local fleet's host is the offer
    assert plan.returncode == 0, out
    wait_until(lambda: Run.objects.filter(name="planned").exists(), timeout=30, what="the run submitted")


def _client(port: int, username: str, key_pem: str, sock=None):
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", port, username=username, pkey=paramiko.Ed25519Key.from_private_key(io.StringIO(key_pem)),
                   sock=sock, look_for_keys=False, allow_agent=False, timeout=10, banner_timeout=10, auth_timeout=10)
    return client


def test_a_jump_login_is_the_jobs_readers_key_only_and_its_streams_are_few(live_server, admin, gateway, make_user):
    """The jump path with a real SSH client (paramiko's): the job's reader logs in as `<job>_jump` and,
    inside a stream, as the same user for the same job; someone else's key is refused at either
    hop, and one login gets a few streams, not a thread per request."""
    submitted = client_for(admin).post("/api/projects/main/runs/", {"configuration": {
        "type": "task", "name": "jumped", "commands": ["sleep 60"]}}, format="json")
    assert submitted.status_code == 201, submitted.json()
    job = Job.objects.get(run__name="jumped")
    login = rules.upstream_id(job) + rules.JUMP_SUFFIX
    mine = keys.keypair_of(admin).private_key
    stranger = keys.keypair_of(make_user("mallory", project="other")).private_key

    with pytest.raises(paramiko.AuthenticationException):
        _client(gateway, login, stranger).close()

    outer = _client(gateway, login, mine)
    try:
        streams = [outer.get_transport().open_channel("direct-tcpip", ("10.0.0.9", 22), ("127.0.0.1", 0))
                   for _ in range(server.MAX_JUMP_STREAMS)]
        with pytest.raises(paramiko.ChannelException):
            outer.get_transport().open_channel("direct-tcpip", ("10.0.0.9", 22), ("127.0.0.1", 0))
        with pytest.raises(paramiko.AuthenticationException):
            _client(gateway, "root", stranger, sock=streams[0]).close()
        inner = _client(gateway, "root", mine, sock=streams[1])
        try:
            with pytest.raises(paramiko.ChannelException):  # no shell or command inside either
                inner.get_transport().open_session()
            with pytest.raises(paramiko.ChannelException):  # no stream onwards from inside
                inner.get_transport().open_channel("direct-tcpip", ("10.0.0.9", 22), ("127.0.0.1", 0))
            logs = inner.get_transport().open_channel("direct-tcpip", ("localhost", rules.RUNNER_HTTP_PORT),
                                                      ("127.0.0.1", 0))
            logs.close()
        finally:
            inner.close()
    finally:
        outer.close()


def _websocket(chan) -> bytes:
    """What the gateway answers a log WebSocket request on `chan` (b"" when it closes the channel)."""
    chan.settimeout(10)
    chan.sendall(b"GET /logs_ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    try:
        return chan.recv(4096)
    except (OSError, TimeoutError):
        return b""


def test_the_channels_inside_a_jump_logins_streams_are_that_logins_and_log_streams_are_capped(
        live_server, admin, gateway, settings):
    """Each jump stream runs an SSH session of its own inside the gateway: what opens there counts
    against the jump login's DSTACK_SSH_MAX_CHANNELS, not a fresh allowance per stream; and every log
    stream (each polls the database) counts against DSTACK_SSH_MAX_LOG_STREAMS, whoever opens it."""
    settings.MUSTER = {**settings.MUSTER, "DSTACK_SSH_MAX_CHANNELS": 3}
    submitted = client_for(admin).post("/api/projects/main/runs/", {"configuration": {
        "type": "task", "name": "capped", "commands": ["sleep 60"]}}, format="json")
    assert submitted.status_code == 201, submitted.json()
    job = Job.objects.get(run__name="capped")
    mine = keys.keypair_of(admin).private_key
    jump = rules.upstream_id(job) + rules.JUMP_SUFFIX
    outer = _client(gateway, jump, mine)
    try:
        streams = [outer.get_transport().open_channel("direct-tcpip", ("10.0.0.9", 22), ("127.0.0.1", 0))
                   for _ in range(2)]
        inners = [_client(gateway, "root", mine, sock=stream) for stream in streams]
        opened = []
        for inner in inners:
            for _ in range(3):
                try:
                    opened.append(inner.get_transport().open_channel(
                        "direct-tcpip", ("localhost", rules.RUNNER_HTTP_PORT), ("127.0.0.1", 0)))
                except paramiko.ChannelException:
                    pass
        assert len(opened) == 3  # the jump login's 3, over both streams (each stream alone allowed 3)
        for inner in inners:
            inner.close()
    finally:
        outer.close()

    settings.MUSTER = {**settings.MUSTER, "DSTACK_SSH_MAX_CHANNELS": 16, "DSTACK_SSH_MAX_LOG_STREAMS": 2}

    def three_streams() -> list[bytes]:
        login = _client(gateway, rules.upstream_id(job) + rules.USER_SUFFIX, mine)
        try:
            return [_websocket(login.get_transport().open_channel(
                "direct-tcpip", ("localhost", rules.RUNNER_HTTP_PORT), ("127.0.0.1", 0))) for _ in range(3)]
        finally:
            login.close()

    # once the streams above have ended (they are released as their channels close): two of three
    def two_of_three() -> list[bytes] | None:
        got = three_streams()
        return got if got.count(b"") == 1 else None

    answers = wait_until(two_of_three, timeout=60, what="two log streams answered and the third closed")
    assert sum(a.startswith(b"HTTP/1.1 101") for a in answers) == 2, answers
