"""What an attach key can do on the job's host, tried with OpenSSH's own `ssh` client against the
real sshd host: reach the job's port (through the key's forced command) and nothing else: no -R
listener (TCP or Unix socket) and no -L, to the job's port or anywhere else."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from runs.models import Run
from runs.services.submission import submit_run
from tests.attach.conftest import ROUTER, attach_installed
from tests.conftest import client_for
from tests.ssh_e2e.helpers import needs_netns
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def openssh_key(tmp_path: Path) -> tuple[Path, str]:
    key = tmp_path / "id_attach"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    return key, key.with_suffix(".pub").read_text().strip()


def attached_key(pool, make_user, project, tmp_path) -> Path:
    submit_run(project, None, {"configuration": ROUTER})
    wait_until(lambda: Run.objects.get(name="routed").current_jobs().filter(status="running").exists(),
               timeout=90, what="the router running")
    key, public = openssh_key(tmp_path)
    attach_installed(client_for(make_user("writer")), public)
    return key


def ssh(pool, key: Path, *args: str, command: str | None = None) -> list[str]:
    host = pool[0]
    return ["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "ExitOnForwardFailure=yes", "-p", str(host.port), *args, f"{pool.user}@{host.address}",
            *([command] if command else [])]


def run(cmd: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, input=stdin, capture_output=True, timeout=20)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(cmd, -1, exc.stdout or b"", exc.stderr or b"")


def answered(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess | None:
    # the job is running before its server listens: a refused connection is tried again
    return None if b"Connection refused" in proc.stderr or proc.returncode == -1 else proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unix_server(path: Path) -> socket.socket:
    """A Unix socket that answers `unix reached` (the hosts share this machine's filesystem)."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"unix reached\n")
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    return server


def read_through(connect) -> bytes:
    """What a connection to a forwarded socket reads (b"" when the forward was refused)."""
    try:
        with connect() as s:
            s.settimeout(5)
            s.sendall(b"GET /answer.txt HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            return data
    except OSError:
        return b""


def with_forward(cmd: list[str], connect) -> tuple[bytes, str]:
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(1.5)  # the session is up, and the client's listener with it
        assert proc.poll() is None, proc.communicate(timeout=10)
        got = read_through(connect)
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    return got


def test_an_attach_key_reaches_the_jobs_port_and_can_open_no_listener_nor_other_forward(
        pool, make_user, project, celery_worker, tmp_path):
    key = attached_key(pool, make_user, project, tmp_path)
    ip = pool[0].address

    # the job's port: the session's command names it, its bytes are the connection's
    reached = wait_until(lambda: answered(run(ssh(pool, key, command="8000"), b"GET /answer.txt HTTP/1.0\r\n\r\n")),
                         timeout=90, what="the router's answer through the key")
    assert reached.returncode == 0, reached.stderr
    assert reached.stdout.endswith(f"router says hi from {ip}\n".encode()), reached.stdout
    other = subprocess.run(ssh(pool, key, command="22"), input=b"", capture_output=True, timeout=30)
    assert other.returncode != 0 and b"SSH-2.0" not in other.stdout
    shell = subprocess.run(ssh(pool, key, command="id"), input=b"", capture_output=True, timeout=30)
    assert shell.returncode != 0 and b"uid=" not in shell.stdout

    # -R: neither a TCP listener on the host nor a Unix socket
    listen = free_port()
    tcp = subprocess.run(ssh(pool, key, "-N", "-R", f"{ip}:{listen}:127.0.0.1:22"), capture_output=True,
                         timeout=30, stdin=subprocess.DEVNULL)
    assert tcp.returncode == 255 and b"remote port forwarding failed" in tcp.stderr, tcp.stderr
    assert pool[0].netns_exec(["ss", "-Hltn", f"sport = :{listen}"]).stdout.strip() == ""
    path = tmp_path / "listener.sock"
    unix = subprocess.run(ssh(pool, key, "-N", "-R", f"{path}:127.0.0.1:22"), capture_output=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    assert unix.returncode == 255 and b"remote port forwarding failed" in unix.stderr, unix.stderr
    assert not path.exists()

    # -L: not even to the job's port (the forced command is the only way there), nor elsewhere
    for target in (f"{ip}:8000", f"{ip}:22"):
        local = free_port()
        got = with_forward(ssh(pool, key, "-N", "-L", f"{local}:{target}"),
                           lambda port=local: socket.create_connection(("127.0.0.1", port), timeout=5))
        assert got == b"", (target, got)
    server = unix_server(tmp_path / "private.sock")
    try:
        local_sock = tmp_path / "local.sock"

        def unix_connect():
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(local_sock))
            return s
        got = with_forward(ssh(pool, key, "-N", "-L", f"{local_sock}:{tmp_path / 'private.sock'}"), unix_connect)
        assert b"unix reached" not in got
    finally:
        server.close()
