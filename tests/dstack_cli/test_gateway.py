"""The SSH gateway with the unchanged dstack CLI and OpenSSH's own client, against a live Muster (a
real Celery worker) and real sshd hosts in namespaces: attached apply follows the log to the end,
attach forwards a job's port, and everything else a key could ask for is refused."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from dstack_api.gateway import server
from dstack_api.services import keys
from projects.models import Membership
from runs.models import Run
from tests.attach.test_ssh import argv_holding
from tests.conftest import token_for
from tests.dstack_cli.helpers import DSTACK, dstack_runner
from tests.ssh_e2e.helpers import needs_netns, netns_pool, short_ssh_timeouts  # noqa: F401 - an autouse fixture
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.dstack_cli, pytest.mark.django_db(transaction=True)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


pool = netns_pool(1)


@pytest.fixture
def gateway(settings):
    port = _free_port()
    settings.MUSTER = {**settings.MUSTER, "DSTACK_SSH_BIND": f"127.0.0.1:{port}"}
    stop = threading.Event()
    threading.Thread(target=server.serve, args=(f"127.0.0.1:{port}", stop), daemon=True).start()
    wait_until(lambda: _try(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True),
               timeout=10, what="the gateway to listen")
    yield port
    stop.set()


@pytest.fixture
def base():
    """A short home: OpenSSH's control socket under ~/.dstack/ssh must fit a Unix socket path (108)."""
    path = Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def dstack(live_server, alice, celery_worker, gateway, base):
    run = dstack_runner(base, live_server.url, token_for(alice), prefix=own_ssh_dir(base))
    # the known_hosts line `manage.py dstack_gateway --known-hosts` prints (docs/dstack-cli.md: for a plain
    # `ssh` or the sshproxy path; the CLI's jump path needs none, test_first_try.py): the keyscan must match it
    scanned = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(gateway), "127.0.0.1"],
                             capture_output=True, text=True, timeout=30)
    line = next(ln for ln in scanned.stdout.splitlines() if not ln.startswith("#"))
    assert line == server.known_hosts_line("127.0.0.1", gateway)
    ssh_dir = base / "dstack-home" / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "known_hosts").write_text(line + "\n")
    return run


def own_ssh_dir(base) -> tuple[str, ...]:
    """OpenSSH reads known_hosts from the passwd home, not $HOME: the CLI runs in a mount namespace
    where the test's own .ssh is /root/.ssh, so the machine's is never touched."""
    ssh_dir = base / "dstack-home" / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return ("unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount --bind "$0" "$(getent passwd "$(id -u)" | cut -d: -f6)/.ssh" && exec "$@"', str(ssh_dir))


def _write(path, doc) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _fleet(dstack, pool, base) -> None:
    (base / "id_fleet").write_text(pool.private_key)
    (base / "id_fleet").chmod(0o600)
    fleet_yml = _write(base / "fleet.yml", {
        "type": "fleet", "name": "gw", "placement": "cluster",
        "ssh_config": {"user": pool.user, "identity_file": str(base / "id_fleet"),
                       "hosts": [{"hostname": h.address, "port": h.port} for h in pool]}})
    applied = dstack("apply", "-f", fleet_yml, "-y")
    assert applied.returncode == 0, (applied.stdout, applied.stderr)


def _status(name: str, wanted: tuple[str, ...]) -> str:
    def reached():
        run = Run.objects.filter(name=name).first()
        return run.status if run is not None and run.status in wanted else None

    return wait_until(reached, timeout=120, what=f"run {name} to be {' or '.join(wanted)}")


def test_attached_apply_prints_the_jobs_log_to_the_end_and_exits_0(dstack, pool, base):
    _fleet(dstack, pool, base)
    task_yml = _write(base / "task.yml", {
        "type": "task", "name": "follow",
        "commands": ["for i in 1 2 3 4; do echo line $i; sleep 1; done", "echo all-done-here"]})
    done = dstack("apply", "-f", task_yml, "-y", timeout=240)
    assert done.returncode == 0, (done.stdout, done.stderr)
    out = done.stdout
    positions = [out.find(f"line {i}\n") for i in (1, 2, 3, 4)] + [out.find("all-done-here")]
    assert -1 not in positions and positions == sorted(positions), out
    assert Run.objects.get(name="follow").status == "done"


def test_attach_forwards_the_jobs_port_and_answers_http_through_it(dstack, pool, base):
    _fleet(dstack, pool, base)
    port = 20000 + os.getpid() % 20000
    task_yml = _write(base / "web.yml", {
        "type": "task", "name": "web", "ports": [port],
        "commands": ["mkdir -p /tmp/gw-$$ && echo hello-through-the-gateway > /tmp/gw-$$/index.html",
                     f"timeout 90 python3 -m http.server {port} --bind 0.0.0.0 --directory /tmp/gw-$$"]})
    submitted = dstack("apply", "-f", task_yml, "-y", "-d")
    assert submitted.returncode == 0, (submitted.stdout, submitted.stderr)
    _status("web", ("running",))
    local = _free_port()
    env = {**os.environ, "HOME": str(base / "dstack-home"), "NO_COLOR": "1", "COLUMNS": "200"}
    env = {k: v for k, v in env.items() if not k.startswith("DSTACK_")}
    attach = subprocess.Popen([*own_ssh_dir(base), str(DSTACK), "attach", "web", "-p", f"{local}:{port}"],
                              env=env, cwd=base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def answer():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=3) as r:
                    return r.read().decode()
            except OSError:
                return None

        assert "hello-through-the-gateway" in wait_until(answer, timeout=60, what="an HTTP answer through attach")
    finally:
        stopped = dstack("stop", "web", "-y")
        assert stopped.returncode == 0, stopped.stderr
        try:
            out, _ = attach.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            attach.kill()
            out, _ = attach.communicate()
    assert f"localhost:{local}" in out, out


def test_dstack_attach_then_ssh_run_runs_a_command_in_the_job(dstack, pool, base):
    """dstack's own way into a job: `dstack attach RUN --job 0` writes the `Host RUN` entry, and
    OpenSSH's `ssh RUN CMD` goes through the gateway to the job's environment on its host."""
    _fleet(dstack, pool, base)
    task_yml = _write(base / "sleepy.yml", {"type": "task", "name": "sleepy", "env": ["GREETING=hi-through-dstack"],
                                           "commands": ["echo here > mark.txt", "sleep 150"]})
    assert dstack("apply", "-f", task_yml, "-y", "-d").returncode == 0
    _status("sleepy", ("running",))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSTACK_")}
    env.update({"HOME": str(base / "dstack-home"), "NO_COLOR": "1", "COLUMNS": "200"})
    attach = subprocess.Popen([*own_ssh_dir(base), str(DSTACK), "attach", "sleepy", "--job", "0"], env=env, cwd=base,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def ran():
        done = subprocess.run([*own_ssh_dir(base), "ssh", "-o", "BatchMode=yes", "sleepy",
                               'echo "$GREETING $(cat mark.txt)"; exit 5'], env=env, cwd=base,
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        return done if done.returncode == 5 else None

    try:
        done = wait_until(ran, timeout=60, what="ssh sleepy through the gateway")
        assert done.stdout == "hi-through-dstack here\n", done.stderr
        # the command (which may hold a token) is in no process's arguments on the host while it runs
        held = subprocess.Popen([*own_ssh_dir(base), "ssh", "-o", "BatchMode=yes", "sleepy",
                                 ": gateway-needle-4711; echo open; sleep 60"], env=env, cwd=base,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        try:
            assert held.stdout.readline() == "open\n"
            assert argv_holding(b"gateway-needle-4711", besides=held.pid) == []
        finally:
            held.kill()
            held.communicate(timeout=30)
    finally:
        assert dstack("stop", "sleepy", "-y").returncode == 0
        attach.kill()
        attach.communicate(timeout=30)


def _ssh(base, port, user, *args, command=(), timeout=30):
    key = base / "dstack-home" / "id_user"
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={base / 'dstack-home' / '.ssh' / 'known_hosts'}",
         "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5", "-p", str(port), *args,
         f"{user}@127.0.0.1", *command], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _tunnel(base, port, user, forward):
    key = base / "dstack-home" / "id_user"
    return subprocess.Popen(
        ["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={base / 'dstack-home' / '.ssh' / 'known_hosts'}",
         "-o", "StrictHostKeyChecking=yes", "-N", "-L", forward, "-p", str(port), f"{user}@127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _ws_get(port: int) -> bytes:
    """A WebSocket handshake on the forwarded port and everything the server sends after it."""
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET /logs_ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        return data


def test_the_gateway_refuses_a_shell_a_command_r_and_l_elsewhere_and_a_removed_members_key(
        dstack, pool, base, alice, gateway):
    _fleet(dstack, pool, base)
    task_yml = _write(base / "task.yml", {"type": "task", "name": "short", "commands": ["echo short-log-line"]})
    assert dstack("apply", "-f", task_yml, "-y", "-d").returncode == 0
    assert _status("short", ("done", "failed")) == "done"
    job = Run.objects.get(name="short").jobs.get()
    user = f"{job.uuid.hex}_root"
    key = base / "dstack-home" / "id_user"
    key.write_text(keys.keypair_of(alice).private_key)
    key.chmod(0o600)

    # the allowed forward works: the log, then a close frame
    local = _free_port()
    tunnel = _tunnel(base, gateway, user, f"{local}:localhost:10999")
    try:
        got = wait_until(lambda: (b := _try(_ws_get, local)) and b"short-log-line" in b and b, timeout=30,
                         what="the log through -L 10999")
        assert got.startswith(b"HTTP/1.1 101") and b"\x88\x02\x03\xe8" in got
        # another destination through the same login: nothing comes back
        assert _ws_get_other(base, gateway, user, "localhost:22") == b""
        host = next(iter(pool))
        assert _ws_get_other(base, gateway, user, f"{host.address}:{host.port}") == b""

        shell = _ssh(base, gateway, user, "-tt")
        assert shell.returncode != 0 and "prohibited" in shell.stderr, shell.stderr
        command = _ssh(base, gateway, user, command=("id",))
        assert command.returncode != 0 and "prohibited" in command.stderr, command.stderr
        reverse = _ssh(base, gateway, user, "-N", "-o", "ExitOnForwardFailure=yes", "-R", "0:localhost:22")
        assert reverse.returncode != 0 and "forwarding failed" in reverse.stderr, reverse.stderr
        other_job = _ssh(base, gateway, "0" * 32 + "_root", "-N")
        assert other_job.returncode != 0 and "Permission denied" in other_job.stderr, other_job.stderr

        # alice leaves the project: the open login can open no channel, a new login is refused
        Membership.objects.filter(user=alice).delete()
        assert _try(_ws_get, local) in (b"", None)
        after = _ssh(base, gateway, user, "-N")
        assert after.returncode != 0 and "Permission denied" in after.stderr, after.stderr
    finally:
        tunnel.kill()
        tunnel.wait(timeout=10)
    assert "prohibited" in tunnel.stderr.read()


def _try(fn, *args):
    try:
        return fn(*args)
    except OSError:
        return None


def _ws_get_other(base, gateway, user, target) -> bytes:
    local = _free_port()
    tunnel = _tunnel(base, gateway, user, f"{local}:{target}")
    try:
        wait_until(lambda: _try(lambda: socket.create_connection(("127.0.0.1", local), timeout=1).close() or True),
                   timeout=20, what="the tunnel to listen")
        time.sleep(0.2)
        return _try(_ws_get, local) or b""
    finally:
        tunnel.kill()
        tunnel.wait(timeout=10)

