"""SSH transport for the ssh backend: connect with a key held as text, run commands, copy files.

Every failure a user can fix is raised as an `SSHError` subclass whose message names the host, the
port and what to check, so the instances app can show it as-is.
"""

from __future__ import annotations

import base64
import binascii
import io
import posixpath
import select
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import paramiko

from backends.base import BackendError

KEEPALIVE_SECONDS = 15


@dataclass
class SSHTarget:
    hostname: str
    port: int = 22
    username: str = "root"
    private_key: str = ""  # OpenSSH or PEM private key text
    host_key: str = ""  # "<keytype> <base64>" as recorded; empty = not yet known (trust on first use)
    runner_home: str = ""  # empty = ${MUSTER_HOME:-$HOME/.muster} on the host

    @property
    def where(self) -> str:
        return f"{self.username}@{self.hostname}:{self.port}"


class SSHError(BackendError):
    """Any failure to talk to a host over SSH.

    A BackendError, so the engine's handlers (which catch BackendError around every runner call)
    see an unreachable host as a backend failure instead of letting the exception kill the task.
    """


class HostUnreachable(SSHError):
    """Nothing answers SSH at the address: refused, timed out, no route, or the connection dropped."""

    reason = "instance_unreachable"


class AuthenticationFailed(SSHError):
    """The host answered but did not accept the user with this key."""


class HostKeyMismatch(SSHError):
    """The host presented a different host key from the one recorded for it."""


class InvalidPrivateKey(SSHError):
    """The private key text cannot be read as an ed25519, ecdsa or rsa key."""


class SSHCommandTimeout(SSHError):
    """A remote command did not finish within its timeout."""


_KEY_CLASSES: tuple[type[paramiko.PKey], ...] = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)


def load_private_key(text: str) -> paramiko.PKey:
    """Parse a private key from its text; encrypted keys are not supported (there is no one to ask)."""
    for cls in _KEY_CLASSES:
        try:
            return cls.from_private_key(io.StringIO(text))
        except paramiko.PasswordRequiredException as exc:
            raise InvalidPrivateKey(
                "the SSH private key is passphrase-protected; supply an unencrypted key"
            ) from exc
        except (paramiko.SSHException, ValueError, TypeError):
            continue
    raise InvalidPrivateKey(
        "the SSH private key could not be read: expected an unencrypted ed25519, ecdsa or rsa key "
        "in OpenSSH or PEM format"
    )


def parse_host_key(text: str) -> paramiko.PKey:
    """A host key recorded as "<keytype> <base64>" (an extra comment field is ignored)."""
    parts = text.split()
    if len(parts) < 2:
        raise SSHError(f"recorded host key {text!r} is not of the form '<keytype> <base64>'")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
    except (ValueError, paramiko.SSHException, binascii.Error) as exc:
        raise SSHError(f"recorded host key {text!r} cannot be parsed: {exc}") from exc


def format_host_key(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def _known_hosts_name(hostname: str, port: int) -> str:
    # The name paramiko looks the server key up under (OpenSSH known_hosts convention).
    return hostname if port == 22 else f"[{hostname}]:{port}"


class _AcceptFirstKey(paramiko.MissingHostKeyPolicy):
    """Trust on first use: the caller reads the key with `remote_host_key` and records it."""

    def missing_host_key(self, client, hostname, key):
        return None


def connect(target: SSHTarget, timeout: float = 10, attempts: int = 2) -> paramiko.SSHClient:
    """Log in to `target`. A handshake cut short (EOF) is tried once more: sshd drops unauthenticated
    connections under load (MaxStartups) and while it starts; refusals and timeouts are not retried."""
    for attempt in range(attempts):
        try:
            return _connect_once(target, timeout)
        except HostUnreachable as exc:
            transient = isinstance(exc.__cause__, (EOFError, paramiko.SSHException))
            if not transient or attempt + 1 == attempts:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")  # the loop returns or raises


def _connect_once(target: SSHTarget, timeout: float) -> paramiko.SSHClient:
    if not target.private_key:
        # paramiko would report "no authentication methods", which reads like a server problem.
        raise AuthenticationFailed(
            f"no SSH private key is configured for {target.where}; add one to the fleet"
        )
    pkey = load_private_key(target.private_key)
    client = paramiko.SSHClient()
    if target.host_key:
        # Known key: paramiko compares it before authenticating and raises BadHostKeyException.
        expected = parse_host_key(target.host_key)
        client.get_host_keys().add(
            _known_hosts_name(target.hostname, target.port), expected.get_name(), expected
        )
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        client.set_missing_host_key_policy(_AcceptFirstKey())
    try:
        client.connect(
            target.hostname,
            port=target.port,
            username=target.username,
            pkey=pkey,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            channel_timeout=timeout,
            look_for_keys=False,
            allow_agent=False,
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise HostKeyMismatch(
            f"{target.where} presented host key {format_host_key(exc.key)[:60]}… but "
            f"{exc.expected_key.get_name()} key {exc.expected_key.get_base64()[:20]}… is recorded for it. "
            "If the host was reinstalled, clear its recorded host key; otherwise do not connect: "
            "something else may be answering at this address."
        ) from exc
    except paramiko.AuthenticationException as exc:
        client.close()
        raise AuthenticationFailed(
            f"{target.where} refused the login: check that user {target.username!r} exists there and that "
            "the public half of the configured private key is in its ~/.ssh/authorized_keys"
        ) from exc
    except paramiko.SSHException as exc:
        client.close()
        # Banner/negotiation failures mean something answers the port but no usable sshd does.
        raise HostUnreachable(
            f"{target.where} did not complete an SSH handshake ({exc}); check that sshd is running on "
            f"port {target.port} and that nothing else listens there"
        ) from exc
    except (OSError, EOFError) as exc:  # refused, timed out, no route, DNS (socket errors are OSError)
        client.close()
        raise HostUnreachable(
            f"cannot reach {target.hostname} port {target.port} ({_describe_socket_error(exc)}); check the "
            "address and port, that sshd is running, and that a firewall allows the server to connect"
        ) from exc
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_SECONDS)
    return client


def _describe_socket_error(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return f"name not resolved: {exc.strerror or exc}"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = {str(e.strerror or e) for e in exc.errors.values()}
        return "; ".join(sorted(reasons)) or "connection failed"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def remote_host_key(client: paramiko.SSHClient) -> str:
    """The key the connected server presented, as "<keytype> <base64>" for recording."""
    transport = client.get_transport()
    if transport is None:
        raise SSHError("not connected")
    return format_host_key(transport.get_remote_server_key())


def _peer(client: paramiko.SSHClient) -> str:
    transport = client.get_transport()
    try:
        host, port = transport.getpeername()[:2] if transport else ("?", "?")
    except OSError:
        return "the host"
    return f"{host}:{port}"


def run(
    client: paramiko.SSHClient,
    command: str,
    timeout: float = 30,
    stdin: bytes | None = None,
) -> tuple[int, bytes, bytes]:
    """Run `command` through the remote user's shell; return (exit status, stdout, stderr).

    Output is drained while the command runs: waiting for the exit status first can deadlock once the
    remote side fills the channel window.
    """
    deadline = time.monotonic() + timeout
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise HostUnreachable(f"the SSH connection to {_peer(client)} is closed")
    try:
        chan = transport.open_session(timeout=timeout)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise HostUnreachable(f"lost the SSH connection to {_peer(client)}: {exc}") from exc
    out, err = bytearray(), bytearray()
    try:
        chan.settimeout(max(0.1, deadline - time.monotonic()))
        chan.exec_command(command)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        while True:
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                if not (chan.recv_ready() or chan.recv_stderr_ready()):
                    break
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SSHCommandTimeout(
                    f"command on {_peer(client)} did not finish within {timeout:g} s: {command[:80]!r}"
                )
            select.select([chan], [], [], min(remaining, 0.5))
        return chan.recv_exit_status(), bytes(out), bytes(err)
    except TimeoutError as exc:  # socket.timeout from sendall on a stalled channel
        raise SSHCommandTimeout(
            f"command on {_peer(client)} did not finish within {timeout:g} s: {command[:80]!r}"
        ) from exc
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostUnreachable(
            f"lost the SSH connection to {_peer(client)} while running a command: {exc}"
        ) from exc
    finally:
        chan.close()


def put_file(
    client: paramiko.SSHClient,
    local: str | Path | bytes,
    remote_path: str,
    mode: int = 0o755,
    timeout: float = 30,
) -> None:
    """Copy a file (a path or the bytes themselves) over SFTP, replacing `remote_path` atomically.

    The data goes to a temporary name and is renamed into place, so a process reading the old file
    (for instance a running agent) never sees a half-written one.
    """
    data = local if isinstance(local, bytes) else Path(local).read_bytes()
    tmp_path = posixpath.join(
        posixpath.dirname(remote_path), f".{posixpath.basename(remote_path)}.{uuid.uuid4().hex}"
    )
    try:
        sftp = client.open_sftp()
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostUnreachable(f"cannot open SFTP to {_peer(client)}: {exc}") from exc
    try:
        sftp.get_channel().settimeout(timeout)
        try:
            sftp.putfo(io.BytesIO(data), tmp_path, file_size=len(data), confirm=True)
            sftp.chmod(tmp_path, mode)
            sftp.posix_rename(tmp_path, remote_path)
        except BaseException:
            _remove_quietly(sftp, tmp_path)
            raise
    except TimeoutError as exc:
        raise SSHCommandTimeout(
            f"copying {remote_path} to {_peer(client)} took longer than {timeout:g} s"
        ) from exc
    except FileNotFoundError as exc:
        raise SSHError(
            f"cannot write {remote_path} on {_peer(client)}: its directory does not exist"
        ) from exc
    except PermissionError as exc:
        raise SSHError(f"cannot write {remote_path} on {_peer(client)}: permission denied") from exc
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostUnreachable(f"copying {remote_path} to {_peer(client)} failed: {exc}") from exc
    finally:
        sftp.close()


def _remove_quietly(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        sftp.remove(path)
    except (OSError, paramiko.SSHException, EOFError):
        pass
