"""The SSH gateway the dstack CLI reaches its jobs through (dstack's sshproxy path).

paramiko's server mode. A connection logs in with a user's dstack key (UserSSHKey) as
`<upstream_id>_root`, naming a job the user may read. It may only open `-L` channels: to
localhost:10999 (the log WebSocket, websocket.py) and to localhost:<one of the job's ports>, which
goes on to that port on the job's host. A session (shell, command, subsystem) and `-R` are refused.
Access is checked again at each channel, so a removed member is cut off at once.

dstack's ProxyJump path, which the CLI takes without asking for a host key: it logs in as
`<upstream_id>_jump` and asks for a stream to the job's host; the gateway connects it nowhere but
serves SSH in that stream itself, where the same key logs in for the same job and gets the same
`-L` forwards as above.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.db import connection

from dstack_api.gateway.websocket import stream_log
from dstack_api.services import gateway as rules

log = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT = 15
CONNECT_TIMEOUT = 10
IDLE_TIMEOUT = 3600  # a forward nobody sends on for an hour is closed
BUFFER = 32 * 1024
MAX_CONNECTIONS = 64
MAX_JUMP_STREAMS = 4  # per jump login: the CLI opens one; each is an SSH server of its own here
PROHIBITED = paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED


def host_key_path() -> Path:
    return Path(settings.DATA_DIR) / "dstack-gateway-host-key"


def host_key() -> paramiko.PKey:
    """The gateway's own key, made once into the data directory (0600): the CLI's known_hosts pins it."""
    path = host_key_path()
    if not path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def known_hosts_line(host: str, port: int) -> str:
    key = host_key()
    where = host if port == 22 else f"[{host}]:{port}"
    return f"{where} {key.get_name()} {key.get_base64()}"


JUMP = rules.Target(logs=False)  # a jump login's stream: the gateway's own SSH server inside it


class Session(paramiko.ServerInterface):
    def __init__(self, peer, outer: Session | None = None):
        self.peer = peer
        self.outer = outer  # the jump login whose stream this session runs in
        self.jump = False
        self.jump_streams = threading.BoundedSemaphore(MAX_JUMP_STREAMS)
        self.user_pk: int | None = None
        self.key: tuple[str, bytes] | None = None
        self.username = ""
        self.targets: dict[int, tuple[rules.Target, object]] = {}

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        jump = rules.jump_login(username) if self.outer is None else None
        # inside a jump stream the job is the jump login's, whatever name the CLI sends there (root)
        name = self.outer.username if self.outer is not None else (jump or username)
        try:
            user = rules.user_of_key(key.get_name(), key.asbytes())
            if self.outer is not None and user is not None and user.pk != self.outer.user_pk:
                user = None
            job = rules.job_for(user, name) if user is not None else None
        finally:
            connection.close()  # paramiko's transport thread: it must not keep a database session
        if job is None:
            log.info("dstack gateway: %s refused as %s", self.peer, username)
            return paramiko.AUTH_FAILED
        self.user_pk, self.key, self.username, self.jump = user.pk, (key.get_name(), key.asbytes()), name, bool(jump)
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return PROHIBITED  # a session: no shell, no command, no subsystem; -L comes as direct-tcpip

    def check_port_forward_request(self, address, port):
        return False  # -R

    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        if self.key is None:
            return PROHIBITED
        try:
            job = rules.still_allowed(self.user_pk, *self.key, self.username)
            if self.jump:  # the stream to "the job's host": served here, connected nowhere
                target = JUMP if job and self.jump_streams.acquire(blocking=False) else None
            else:
                target = rules.forward_target(job, destination[0], int(destination[1])) if job else None
        finally:
            connection.close()
        if target is None:
            log.info("dstack gateway: %s as %s: forward to %s:%s refused", self.peer, self.username, *destination)
            return PROHIBITED
        self.targets[chanid] = (target, job)
        return paramiko.OPEN_SUCCEEDED


def _pump(src, dst) -> None:
    try:
        while True:
            data = src.recv(BUFFER)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for end in (src, dst):
            try:
                end.close()
            except OSError:
                pass


def _serve_channel(chan, target: rules.Target, job) -> None:
    try:
        if target.logs:
            chan.settimeout(IDLE_TIMEOUT)
            stream_log(chan, job)
            return
        sock = socket.create_connection((target.ip, target.port), timeout=CONNECT_TIMEOUT)
        sock.settimeout(IDLE_TIMEOUT)
        chan.settimeout(IDLE_TIMEOUT)
        threading.Thread(target=_pump, args=(sock, chan), daemon=True).start()
        _pump(chan, sock)
        return
    except (OSError, paramiko.SSHException) as exc:
        log.info("dstack gateway: channel to %s ended: %s", target, exc)
    finally:
        connection.close()
    chan.close()


def _serve_transport(sock, peer, key: paramiko.PKey, outer: Session | None = None) -> None:
    """One SSH connection: on a client's socket, or (outer given) in a jump login's stream."""
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = transport.handshake_timeout = transport.auth_timeout = HANDSHAKE_TIMEOUT
        transport.add_server_key(key)
        session = Session(peer, outer)
        transport.start_server(server=session)
        while transport.is_active():
            chan = transport.accept(timeout=1)
            if chan is None:
                continue
            found = session.targets.pop(chan.get_id(), None)
            if found is None:
                chan.close()
                continue
            if found[0] is JUMP:
                threading.Thread(target=_serve_transport, args=(chan, peer, key, session), daemon=True).start()
                continue
            threading.Thread(target=_serve_channel, args=(chan, *found), daemon=True).start()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        log.info("dstack gateway: %s: %r", peer, exc)
    finally:
        transport.close()
        connection.close()
        if outer is not None:
            outer.jump_streams.release()


def _serve_connection(sock, peer, key: paramiko.PKey, slots: threading.Semaphore) -> None:
    try:
        _serve_transport(sock, peer, key)
    finally:
        slots.release()


def serve(bind: str, stop: threading.Event | None = None) -> None:
    host, _, port = bind.rpartition(":")
    key = host_key()
    listener = socket.create_server((host.strip("[]") or "0.0.0.0", int(port)))
    listener.settimeout(1)
    log.warning("dstack gateway: listening on %s (host key %s)", bind, key.fingerprint)
    slots = threading.Semaphore(MAX_CONNECTIONS)
    while stop is None or not stop.is_set():
        try:
            sock, peer = listener.accept()
        except TimeoutError:
            continue
        if not slots.acquire(blocking=False):
            sock.close()  # full: the CLI retries
            continue
        sock.settimeout(HANDSHAKE_TIMEOUT)
        threading.Thread(target=_serve_connection, args=(sock, peer, key, slots), daemon=True).start()
    listener.close()
