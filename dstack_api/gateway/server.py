"""The SSH gateway the dstack CLI reaches its jobs through (dstack's sshproxy path).

paramiko's server mode. A connection logs in with a user's dstack key (UserSSHKey) as
`<upstream_id>_root`, naming a job the user may read. It may only open `-L` channels: to
localhost:10999 (the log WebSocket, websocket.py) and to localhost:<one of the job's ports>, which
goes on to that port on the job's host (writers only, and only to an address the SSH host policy
allows: dstack_api/services/gateway.py). A session's shell or command runs in a running job, for
writers only (shell.py: `ssh <run>` after `dstack attach`); a subsystem and `-R` are refused.

Access is checked again at each channel and every DSTACK_SSH_RECHECK seconds while connected, so an
open forward of a removed member is closed within that bound. Limits (settings, docs/security.md): a
client must log in within DSTACK_SSH_AUTH_TIMEOUT of connecting; connections are capped in all, per
address and per user (limits.py); channels per login by DSTACK_SSH_MAX_CHANNELS (the channels of
the SSH sessions inside a jump login's streams count as that login's), log streams in all by
DSTACK_SSH_MAX_LOG_STREAMS, and a log channel ends when its client goes away.

dstack's ProxyJump path, which the CLI takes without asking for a host key: it logs in as
`<upstream_id>_jump` and asks for a stream to the job's host; the gateway connects it nowhere but
serves SSH in that stream itself, where the same key logs in for the same job and gets the same
`-L` forwards as above (at most MAX_JUMP_STREAMS such streams per jump login; a stream is no
connection of its own, and the forwards inside it are the jump login's channels).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.db import connection

from dstack_api.gateway import shell
from dstack_api.gateway.limits import Counts, limit
from dstack_api.gateway.websocket import stream_log
from dstack_api.services import gateway as rules

log = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT = 15
CONNECT_TIMEOUT = 10
IDLE_TIMEOUT = 3600  # a forward nobody sends on for an hour is closed
BUFFER = 32 * 1024
BIND_RETRY = 5.0  # seconds between tries to listen on a port that was taken
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
    def __init__(self, peer, counts: Counts, outer: Session | None = None):
        self.peer, self.counts = peer, counts
        self.outer = outer  # the jump login whose stream this session runs in
        self.jump = False
        self.jump_streams = threading.BoundedSemaphore(MAX_JUMP_STREAMS)
        self.user_pk: int | None = None
        self.key: tuple[str, bytes] | None = None
        self.username = ""
        self.lock = threading.Lock()
        self.targets: dict[int, tuple[rules.Target, object]] = {}
        self.channels = 0  # approved and not yet ended, of this login and its jump streams: DSTACK_SSH_MAX_CHANNELS
        self.forwards: set = set()  # open channels to job ports, closed if the member loses them
        self.shells: dict[int, shell.ShellRequest] = {}  # session channels (shell.py), by channel id

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
            grant = rules.grant_for(user, name) if user is not None else None
        finally:
            connection.close()  # paramiko's transport thread: it must not keep a database session
        if grant is None or (self.user_pk is not None and user.pk != self.user_pk):
            log.info("dstack gateway: %s refused as %s", self.peer, username)
            return paramiko.AUTH_FAILED
        # asked before the signature is checked (and for a mere "would this key do?"), so the login
        # is counted only once the transport says it is authenticated (_count_login); refused here
        # already when full, so the client reads "Permission denied" rather than a closed connection
        if self.outer is None and self.counts.logged_in(user.pk) >= limit("DSTACK_SSH_MAX_PER_USER"):
            log.warning("dstack gateway: %s refused as %s: the user holds DSTACK_SSH_MAX_PER_USER connections",
                        self.peer, username)
            return paramiko.AUTH_FAILED
        self.user_pk, self.key, self.username, self.jump = user.pk, (key.get_name(), key.asbytes()), name, bool(jump)
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        # a session: a shell or command in a running job for a writer (shell.py: `ssh <run>` after
        # `dstack attach`), else refused, as a subsystem always is; -L comes as direct-tcpip
        if kind != "session" or self.key is None or self.jump:
            return PROHIBITED
        try:
            grant = self.recheck()
            if not shell.allowed(grant):
                log.info("dstack gateway: %s as %s: session refused", self.peer, self.username)
                return PROHIBITED
        finally:
            connection.close()
        owner = self.outer or self
        with owner.lock:
            if owner.channels >= limit("DSTACK_SSH_MAX_CHANNELS"):
                return PROHIBITED
            owner.channels += 1
        request = shell.ShellRequest()
        with self.lock:
            self.targets[chanid] = (request, grant.job)
            self.shells[chanid] = request
        return paramiko.OPEN_SUCCEEDED

    def _shell(self, channel) -> shell.ShellRequest | None:
        with self.lock:
            return self.shells.get(channel.get_id())

    def check_channel_pty_request(self, channel, term, width, height, pixelwidth, pixelheight, modes):
        request = self._shell(channel)
        if request is None or request.started.is_set():
            return False
        request.pty = (term.decode(errors="replace") if isinstance(term, bytes) else term, width, height)
        return True

    def check_channel_shell_request(self, channel):
        request = self._shell(channel)
        return request is not None and request.start(None)

    def check_channel_exec_request(self, channel, command):
        request = self._shell(channel)
        text = command.decode(errors="replace") if isinstance(command, bytes) else command
        return request is not None and request.start(text)

    def check_channel_window_change_request(self, channel, width, height, pixelwidth, pixelheight):
        request = self._shell(channel)
        return request is not None and request.resize(width, height)

    def check_port_forward_request(self, address, port):
        return False  # -R

    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        if self.key is None:
            return PROHIBITED
        try:
            grant = self.recheck()
            if self.jump:  # the stream to "the job's host": served here, connected nowhere
                target = JUMP if grant and self.jump_streams.acquire(blocking=False) else None
            else:
                target = rules.forward_target(grant, destination[0], int(destination[1])) if grant else None
        finally:
            connection.close()
        if target is None:
            log.info("dstack gateway: %s as %s: forward to %s:%s refused", self.peer, self.username, *destination)
            return PROHIBITED
        if target is not JUMP:  # a jump stream is bounded by jump_streams; what opens inside it counts here
            owner = self.outer or self
            with owner.lock:
                if owner.channels >= limit("DSTACK_SSH_MAX_CHANNELS"):
                    log.info("dstack gateway: %s as %s: channel refused, %d open (DSTACK_SSH_MAX_CHANNELS)",
                             self.peer, self.username, owner.channels)
                    return PROHIBITED
                owner.channels += 1
        with self.lock:
            self.targets[chanid] = (target, grant.job)
        return paramiko.OPEN_SUCCEEDED

    def recheck(self):
        """The login's grant now: None once the key, the user or the membership is gone."""
        return rules.still_allowed(self.user_pk, *self.key, self.username) if self.key else None

    def channel_ended(self, chan) -> None:
        owner = self.outer or self
        with owner.lock:
            owner.channels -= 1
        with self.lock:
            self.forwards.discard(chan)
            self.shells.pop(chan.get_id(), None)


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


def _serve_channel(session: Session, chan, target: rules.Target, job) -> None:
    try:
        if target.logs:
            if not session.counts.open_log():
                log.warning("dstack gateway: %s as %s: log stream refused: DSTACK_SSH_MAX_LOG_STREAMS are open",
                            session.peer, session.username)
                return
            try:
                chan.settimeout(IDLE_TIMEOUT)
                stream_log(chan, job)
            finally:
                session.counts.close_log()
            return
        sock = socket.create_connection((target.ip, target.port), timeout=CONNECT_TIMEOUT)
        sock.settimeout(IDLE_TIMEOUT)
        chan.settimeout(IDLE_TIMEOUT)
        with session.lock:
            session.forwards.add(chan)
        threading.Thread(target=_pump, args=(sock, chan), daemon=True, name="dstack-gateway-forward").start()
        _pump(chan, sock)
        return
    except (OSError, paramiko.SSHException) as exc:
        log.info("dstack gateway: channel to %s ended: %s", target, exc)
    finally:
        connection.close()
        session.channel_ended(chan)
        chan.close()


def _serve_shell(session: Session, chan, request: shell.ShellRequest, job) -> None:
    with session.lock:
        session.forwards.add(chan)  # a member made read-only loses it as a forward (_still_member)
    try:
        shell.serve(chan, request, job)
    finally:
        session.channel_ended(chan)
        chan.close()


def _still_member(session: Session) -> bool:
    """False once the login's access is gone; a member made read-only loses the open port forwards."""
    try:
        grant = session.recheck()
    finally:
        connection.close()
    if grant is None:
        return False
    if not grant.ports:
        with session.lock:
            forwards = list(session.forwards)
        for chan in forwards:
            chan.close()
    return True


def _serve_transport(sock, peer, key: paramiko.PKey, counts: Counts, outer: Session | None = None) -> None:
    """One SSH connection: on a client's socket, or (outer given) in a jump login's stream, which
    holds no connection slot and no login of its own: its outer login holds them."""
    transport = paramiko.Transport(sock)
    session = Session(peer, counts, outer)
    started = time.monotonic()
    counted = False  # the login is counted against DSTACK_SSH_MAX_PER_USER
    try:
        transport.banner_timeout = transport.handshake_timeout = HANDSHAKE_TIMEOUT
        transport.add_server_key(key)
        transport.start_server(server=session)
        next_check = started + float(settings.MUSTER["DSTACK_SSH_RECHECK"])
        while transport.is_active():
            chan = transport.accept(timeout=1)
            now = time.monotonic()
            if not transport.is_authenticated():
                if now - started > float(settings.MUSTER["DSTACK_SSH_AUTH_TIMEOUT"]):
                    log.info("dstack gateway: %s did not log in within DSTACK_SSH_AUTH_TIMEOUT; dropped", peer)
                    break
            elif not counted and outer is None:
                counted = counts.login(session.user_pk)
                if not counted:  # another login of the user's was counted in between
                    log.warning("dstack gateway: %s as %s: over DSTACK_SSH_MAX_PER_USER; closed", peer, session.username)
                    break
            elif now >= next_check:
                next_check = now + float(settings.MUSTER["DSTACK_SSH_RECHECK"])
                if not _still_member(session):
                    log.info("dstack gateway: %s as %s: access ended; connection closed", peer, session.username)
                    break
            if chan is None:
                continue
            with session.lock:
                found = session.targets.pop(chan.get_id(), None)
            if found is None:
                chan.close()
                continue
            if found[0] is JUMP:
                threading.Thread(target=_serve_transport, args=(chan, peer, key, counts, session), daemon=True,
                                 name="dstack-gateway-jump").start()
                continue
            if isinstance(found[0], shell.ShellRequest):
                threading.Thread(target=_serve_shell, args=(session, chan, *found), daemon=True,
                                 name="dstack-gateway-shell").start()
                continue
            name = "dstack-gateway-log" if found[0].logs else "dstack-gateway-forward"
            threading.Thread(target=_serve_channel, args=(session, chan, *found), daemon=True, name=name).start()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        log.info("dstack gateway: %s: %r", peer, exc)
    finally:
        transport.close()
        connection.close()
        if counted:
            counts.logout(session.user_pk)
        if outer is None:
            counts.release(peer[0])
        else:
            outer.jump_streams.release()


def _serve_connection(sock, peer, key: paramiko.PKey, counts: Counts) -> None:
    _serve_transport(sock, peer, key, counts)


def _listen(host: str, port: int, stop: threading.Event) -> socket.socket | None:
    """The listening socket; a port in use is said once, on one line, and tried again quietly."""
    said = False
    while not stop.is_set():
        try:
            listener = socket.create_server((host, port))
        except OSError as exc:
            if not said:
                log.error("ERROR: dstack gateway cannot listen on %s:%s (%s); trying again every %g s. "
                          "Free the port, or pick another with MUSTER_DSTACK_SSH_PORT or `muster serve "
                          "--gateway-port`", host, port, os.strerror(exc.errno) if exc.errno else exc, BIND_RETRY)
                said = True
            stop.wait(BIND_RETRY)
            continue
        return listener
    return None


def serve(bind: str, stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()
    host, _, port = bind.rpartition(":")
    key = host_key()
    listener = _listen(host.strip("[]") or "0.0.0.0", int(port), stop)
    if listener is None:
        return
    listener.settimeout(1)
    log.warning("dstack gateway: listening on %s (host key %s)", bind, key.fingerprint)
    counts = Counts()
    while not stop.is_set():
        try:
            sock, peer = listener.accept()
        except TimeoutError:
            continue
        why = counts.admit(peer[0])
        if why:
            log.info("dstack gateway: %s refused: %s", peer, why)
            sock.close()  # the CLI retries
            continue
        sock.settimeout(HANDSHAKE_TIMEOUT)
        threading.Thread(target=_serve_connection, args=(sock, peer, key, counts), daemon=True,
                         name="dstack-gateway-connection").start()
    listener.close()
