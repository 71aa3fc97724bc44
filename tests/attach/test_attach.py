"""`muster attach` against real sshd hosts in network namespaces, a live server and a real worker.

The router serves HTTP on port 8000 at its host's own address, which the user's machine (here, the
root namespace) reaches only through the forward. The user's key is their own (made by the CLI);
on the host it reaches the job's port and nothing else, and it is gone once the run ends.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import paramiko
import pytest

from runs.models import Run
from tests.attach.conftest import ROUTER, attach_installed
from tests.conftest import client_for
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import needs_netns
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]



def muster(env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MUSTER, *args], env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2])


class Attached:
    """`muster attach` running in the background, its stderr collected line by line."""

    def __init__(self, env, *args: str):
        self.proc = subprocess.Popen([*MUSTER, "attach", *args], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=Path(__file__).resolve().parents[2])
        self.err: list[str] = []
        self.out: list[str] = []
        for stream, sink in ((self.proc.stderr, self.err), (self.proc.stdout, self.out)):
            threading.Thread(target=lambda s=stream, k=sink: k.extend(iter(s.readline, "")), daemon=True).start()

    def local_port(self) -> int:
        def found():
            for line in self.err:
                m = re.search(r"forwarding http://127\.0\.0\.1:(\d+) -> ([\d.]+):8000", line)
                if m:
                    return int(m.group(1))
            assert self.proc.poll() is None, "".join(self.err)
            return None
        return wait_until(found, timeout=120, what="the forwarding line")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def attach_lines(pool) -> list[str]:
    return [line for line in pool.authorized_keys.read_text().splitlines() if "muster-attach-" in line]


def test_attach_forwards_the_routers_port_and_the_key_is_gone_after_the_run(pool, cli_env, celery_worker, tmp_path):
    task = tmp_path / "router.yml"
    task.write_text(ROUTER)
    assert muster(cli_env, "apply", "-f", str(task), "-y", "-d").returncode == 0

    attached = Attached(cli_env, "routed")
    try:
        port = attached.local_port()
        ip = pool[0].address
        answer = wait_until(lambda: fetch(f"http://127.0.0.1:{port}/answer.txt"), timeout=60,
                            what="the router's answer through the forward")
        assert answer == f"router says hi from {ip}\n"

        # on the host: the user's public key (made on the user's machine), restricted to this port
        key_file = Path(cli_env["HOME"]) / ".muster" / "attach_key"
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        public = (key_file.parent / "attach_key.pub").read_text().split()[1]
        [line] = attach_lines(pool)
        assert line.startswith('restrict,command="') and f"forward --to {ip} --ports 8000" in line
        assert public in line
        assert_the_key_reaches_nothing_else(pool, key_file, ip)

        assert muster(cli_env, "stop", "routed", "-y").returncode == 0
        assert wait_for_run("routed", timeout=90).status == "terminated"
        assert attach_lines(pool) == []
        assert "muster-tests" in pool.authorized_keys.read_text()  # the fleet's own key stays
        wait_until(lambda: attached.proc.poll() is not None, timeout=60, what="attach to end with the run")
        assert attached.proc.returncode == 0, "".join(attached.err)
        # the logs were followed meanwhile: the router's own line for the request made above
        assert any(line.startswith("[default/0] ") and "GET /answer.txt" in line for line in attached.out), \
            attached.out
    finally:
        attached.close()


def assert_the_key_reaches_nothing_else(pool, key_file: Path, ip: str) -> None:
    host = pool[0]
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(host.address, port=host.port, username=pool.user, key_filename=str(key_file),
                   look_for_keys=False, allow_agent=False, timeout=10)
    try:
        _, stdout, _ = client.exec_command("echo reached", timeout=10)
        assert stdout.read() == b"" and stdout.channel.recv_exit_status() != 0  # command="/bin/false"
        with pytest.raises(paramiko.ChannelException):
            client.get_transport().open_channel("direct-tcpip", (ip, 22), ("127.0.0.1", 1), timeout=10)
    finally:
        client.close()


def test_attach_is_refused_to_read_only_members_and_to_keys_with_options(pool, make_user, celery_worker, project):
    from runs.services.submission import submit_run

    run = submit_run(project, None, {"configuration": ROUTER})
    wait_until(lambda: Run.objects.get(pk=run.pk).current_jobs().filter(status="running").exists(), timeout=90,
               what="the router running")
    public = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    url = "/api/projects/main/runs/routed/attach"

    reader = client_for(make_user("reader", role="read-only"))
    denied = reader.post(url, {"job": 0, "public_key": public}, format="json")
    assert denied.status_code == 403

    writer = client_for(make_user("writer"))
    injected = writer.post(url, {"job": 0, "public_key": f'command="sh" {public}'}, format="json")
    assert injected.status_code == 400
    assert injected.json()["errors"][0]["loc"] == ["public_key"]
    two_lines = writer.post(url, {"job": 0, "public_key": f"{public}\n{public}"}, format="json")
    assert two_lines.status_code == 400
    assert attach_lines(pool) == []

    ok = attach_installed(writer, public)
    assert ok["ports"] == [8000] and ok["ssh"]["hostname"] == pool[0].address
    assert len(attach_lines(pool)) == 1
    writer.post("/api/projects/main/runs/routed/stop", {"abort": True}, format="json")
    wait_for_run("routed", timeout=90)
    assert attach_lines(pool) == []
