"""`muster attach RUN`: the job's ports on localhost, and every job's log, until Ctrl-C.

The key pair is the user's own, made here on first use (~/.muster/attach_key, 0600); only its
public half goes to the server, which allows it on the job's host to reach the job's ports only (one
session per connection, its command naming the port), until the job ends (runs/services/attach.py). paramiko is imported only here: the other commands stay
standard library + PyYAML.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from pathlib import Path
from typing import Any

from cli import follow
from cli.client import Client, CliError, UsageError
from cli.follow import say, segment

SSH_TIMEOUT = 15.0
KEEPALIVE_SECONDS = 15
BUFFER = 64 << 10
# how long attach waits for the job to start before giving up
START_WAIT_SECONDS = 900.0


def parse_port_maps(items: list[str] | None) -> dict[int, int]:
    """-p LOCAL:JOB_PORT -> {JOB_PORT: LOCAL}."""
    maps = {}
    for item in items or []:
        local, sep, remote = item.partition(":")
        if not sep or not local.isdigit() or not remote.isdigit():
            raise UsageError(f"-p {item!r}: expected LOCAL_PORT:JOB_PORT, e.g. 18000:8000")
        maps[int(remote)] = int(local)
    return maps


def key_paths() -> tuple[Path, Path]:
    base = Path("~/.muster").expanduser()
    return base / "attach_key", base / "attach_key.pub"


def ensure_key():
    """The user's attach key (a paramiko key), made on first use; the public key line."""
    import paramiko
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, public = key_paths()
    if not private.exists():
        private.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
        pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        public.write_text(pub.decode() + " muster-attach\n")
        say(f"Made your attach key {private} (only its public half is sent to the server)")
    if private.stat().st_mode & 0o077:
        raise CliError(f"{private} is readable by others: chmod 600 {private}")
    try:
        pkey = paramiko.Ed25519Key.from_private_key_file(str(private))
    except (paramiko.SSHException, OSError) as exc:
        raise CliError(f"cannot read {private}: {exc}; delete it and a new one is made") from None
    return pkey, f"{pkey.get_name()} {pkey.get_base64()}"


def wait_until_started(client: Client, name: str, job_num: int) -> dict[str, Any]:
    deadline = time.monotonic() + START_WAIT_SECONDS
    shown = None
    while True:
        run = follow.get_run(client, name)
        job = next((j for j in run.get("jobs") or [] if j.get("job_num") == job_num), None)
        if job is None:
            raise CliError(f"run {name} has no job {job_num}")
        if job.get("status") in ("pulling", "running"):
            return job
        if job.get("status") in follow.JOB_FINISHED or run.get("status") in follow.RUN_FINISHED:
            raise CliError(f"job {job_num} of run {name} is {job.get('status')}: nothing to attach to")
        if job.get("status") != shown:
            shown = job.get("status")
            say(f"job {job_num} ({follow.label(job)}): {shown}; waiting for it to start")
        if time.monotonic() > deadline:
            raise CliError(f"job {job_num} of run {name} has not started in {START_WAIT_SECONDS:g} s")
        time.sleep(follow.POLL_SECONDS)


# how long attach waits for a worker to put the key on the job's host
INSTALL_WAIT_SECONDS = 120.0


def wait_until_installed(client: Client, name: str, info: dict[str, Any],
                         timeout: float = INSTALL_WAIT_SECONDS) -> dict[str, Any]:
    """The server answers an attach at once and a worker installs the key on the host: poll the
    attach until the key is in (as `muster fleet apply` waits for a registration), saying why it
    waits when the host did not take it yet."""
    path = f"runs/{segment(name)}/attach/{info['id']}"
    deadline = time.monotonic() + timeout
    shown = ""
    while True:
        if info.get("status") == "installed":
            return info
        if info.get("status") != "installing":
            raise CliError(info.get("error") or f"the attach key was not installed ({info.get('status')})")
        if info.get("error") and info["error"] != shown:
            shown = info["error"]
            say(f"{shown}; the server tries again")
        if time.monotonic() > deadline:
            why = f" (last try: {shown})" if shown else ""
            raise CliError(f"the server has not installed the attach key on job {info.get('job')}'s host after "
                           f"{timeout:g} s{why}: is the host reachable? (`muster fleet list`); try again later")
        time.sleep(follow.POLL_SECONDS)
        info = client.get(path)


def connect(ssh: dict[str, Any], pkey):
    """An SSH transport to the job's host, checked against the host key the server recorded."""
    import paramiko

    expected = (ssh.get("host_key") or "").split()
    if len(expected) < 2:
        raise CliError(f"the server has no host key for {ssh['hostname']}: cannot check whom we talk to")
    try:
        sock = socket.create_connection((ssh["hostname"], int(ssh["port"])), timeout=SSH_TIMEOUT)
        transport = paramiko.Transport(sock)
        transport.banner_timeout = transport.auth_timeout = SSH_TIMEOUT
        transport.start_client(timeout=SSH_TIMEOUT)
        key = transport.get_remote_server_key()
        if [key.get_name(), key.get_base64()] != expected[:2]:
            transport.close()
            raise CliError(f"{ssh['hostname']}:{ssh['port']} presented a host key other than the one the "
                           "server recorded: not connecting")
        transport.auth_publickey(ssh["username"], pkey)
    except (OSError, paramiko.SSHException) as exc:
        raise CliError(f"cannot connect to {ssh['username']}@{ssh['hostname']}:{ssh['port']}: {exc}") from None
    transport.set_keepalive(KEEPALIVE_SECONDS)
    return transport


def _pump(local: socket.socket, channel) -> None:
    try:
        while True:
            ready, _, _ = select.select([local, channel], [], [], 60)
            if local in ready:
                data = local.recv(BUFFER)
                if not data:
                    break
                channel.sendall(data)
            if channel in ready:
                data = channel.recv(BUFFER)
                if not data:
                    break
                local.sendall(data)
    except OSError:
        pass
    finally:
        channel.close()
        local.close()


class Forward:
    """127.0.0.1:local_port -> ip:port through the host, one channel per accepted connection."""

    def __init__(self, transport, ip: str, port: int, local_port: int):
        self.transport, self.ip, self.port = transport, ip, port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind(("127.0.0.1", local_port))
        except OSError:
            self.listener.bind(("127.0.0.1", 0))  # the same number is taken here: any free one
        self.listener.listen(16)
        self.local_port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            try:
                # the key may not forward: its forced command carries this session's bytes to the
                # port named as the command (runs/services/attach.py)
                channel = self.transport.open_session(timeout=SSH_TIMEOUT)
                channel.exec_command(str(self.port))
            except Exception as exc:  # noqa: BLE001  (paramiko raises several kinds; the user needs the line)
                say(f"forward to {self.ip}:{self.port} refused: {exc}")
                conn.close()
                continue
            threading.Thread(target=_pump, args=(conn, channel), daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def attach(client: Client, name: str, job_num: int, local_ports: dict[int, int]) -> int:
    # the run is looked at first: no key is made for a run that does not exist or has ended
    wait_until_started(client, name, job_num)
    pkey, public = ensure_key()
    info = client.post(f"runs/{segment(name)}/attach", {"job": job_num, "public_key": public})
    if info.get("status") == "installing":
        info = wait_until_installed(client, name, info)
    where = f"job {job_num} ({info.get('node_group_name')}/{info.get('node_group_rank')})"
    transport, forwards = None, []
    if not info.get("ssh"):  # a local job: the server answers without a way in
        for port in info.get("ports") or []:
            say(f"{where} listens on http://{info['ip']}:{port} on the server's machine (nothing to forward)")
    else:
        transport = connect(info["ssh"], pkey)
        for port in info.get("ports") or []:
            fwd = Forward(transport, info["ip"], port, local_ports.get(port, port))
            forwards.append(fwd)
            say(f"forwarding http://127.0.0.1:{fwd.local_port} -> {info['ip']}:{port} ({where})")
    say("following the logs; Ctrl-C detaches (the run keeps going)")
    try:
        return follow.follow_logs(client, name, None, None, follow=True)
    finally:
        for fwd in forwards:
            fwd.close()
        if transport is not None:
            transport.close()
