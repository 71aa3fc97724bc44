"""SSH transport for the ssh backend: connect with a key held as text, run commands, copy files.

Every failure a user can fix is raised as an `SSHError` subclass whose message names the host, the
port and what to check, so the instances app can show it as-is.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import ipaddress
import logging
import posixpath
import select
import shlex
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import paramiko

from backends.base import BackendError

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15
# Bytes of stdout + stderr one remote command may print before its channel is closed. A host whose
# login shell (or ForceCommand, or ~/.bashrc) prints without end would otherwise grow the server's
# memory until it dies. MUSTER["SSH_OUTPUT_LIMIT"] overrides it.
DEFAULT_OUTPUT_LIMIT = 4 << 20


@dataclass
class SSHTarget:
    hostname: str
    port: int = 22
    username: str = "root"
    private_key: str = ""  # OpenSSH or PEM private key text
    host_key: str = ""  # "<keytype> <base64>" as recorded; empty = not yet known (trust on first use)
    # empty = ${MUSTER_HOME:-$HOME/.muster} on the host; a relative path is under that default home
    runner_home: str = ""

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


class OutputTooLarge(SSHError):
    """A remote command printed more than the output limit; its channel was closed."""


class HostNotAllowed(SSHError):
    """The operator's fleet host policy does not allow connecting to this address."""


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


def fingerprint(key: paramiko.PKey | str) -> str:
    """The OpenSSH SHA256 fingerprint (`ssh-keygen -lf`), which is what a user can compare."""
    blob = key.asbytes() if isinstance(key, paramiko.PKey) else base64.b64decode(key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


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
    sock = _open_socket(target, timeout)
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
            sock=sock,
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise HostKeyMismatch(
            f"{target.where} presented host key {exc.key.get_name()} {fingerprint(exc.key)}, but "
            f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)} is expected. If the host was "
            "reinstalled, correct its host_key (or re-register it); otherwise do not connect: "
            "something else may be answering at this address."
        ) from exc
    except paramiko.AuthenticationException as exc:
        client.close()
        raise AuthenticationFailed(
            f"{target.where} refused the login: check that user {target.username!r} exists there and that "
            "the public half of the configured private key is in its ~/.ssh/authorized_keys"
        ) from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        client.close()
        # A port that answers but is no sshd reads like a closed one: telling them apart would let
        # anyone who can register a fleet map which ports are open where the server can reach.
        raise _unreachable(target, exc) from exc
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_SECONDS)
    return client


def _unreachable(target: SSHTarget, exc: BaseException) -> HostUnreachable:
    log.info("cannot reach %s: %s", target.where, _describe_socket_error(exc))  # the detail is for the operator
    return HostUnreachable(
        f"cannot reach {target.hostname}:{target.port} over SSH: check the address and port, that sshd "
        "is running there, and that a firewall allows the Muster server to connect"
    )


def _networks(cidrs: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(c.strip(), strict=False) for c in cidrs if c.strip()]


def address_allowed(address: str, allow: Iterable[str], deny: Iterable[str]) -> bool:
    """Deny wins over allow; an empty allow list allows every address not denied."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
    allowed = _networks(allow)
    if any(ip in net for net in _networks(deny) if net.version == ip.version):
        return False
    return not allowed or any(ip in net for net in allowed if net.version == ip.version)


def host_policy() -> tuple[list[str], list[str]]:
    """(allow, deny) CIDRs of MUSTER_SSH_HOSTS_ALLOW / _DENY; applied to every SSH connection, not only
    at registration, so a name that later resolves elsewhere is held to the same rule."""
    from django.conf import settings

    return list(settings.MUSTER.get("SSH_HOSTS_ALLOW") or []), list(settings.MUSTER.get("SSH_HOSTS_DENY") or [])


def _open_socket(target: SSHTarget, timeout: float) -> socket.socket:
    """A TCP connection to the first allowed address of the host that answers.

    Each resolved address is checked just before connecting to that very address, so a DNS answer
    cannot change between the check and the connection.
    """
    allow, deny = host_policy()
    try:
        infos = socket.getaddrinfo(target.hostname, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
        raise _unreachable(target, exc) from exc
    addresses = list(dict.fromkeys((info[0], info[4]) for info in infos))
    permitted = [(family, sockaddr) for family, sockaddr in addresses
                 if address_allowed(sockaddr[0], allow, deny)]
    if addresses and not permitted:
        raise HostNotAllowed(
            f"{target.hostname}:{target.port} is not an address this server connects to (the operator's "
            "MUSTER_SSH_HOSTS_ALLOW / MUSTER_SSH_HOSTS_DENY); register a host on an allowed network"
        )
    last: BaseException = OSError("no address")
    for family, sockaddr in permitted:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise _unreachable(target, last) from last


def _describe_socket_error(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return f"name not resolved: {exc.strerror or exc}"
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
    max_output: int | None = None,
) -> tuple[int, bytes, bytes]:
    """Run `command` through the remote user's shell; return (exit status, stdout, stderr).

    Output is drained while the command runs: waiting for the exit status first can deadlock once the
    remote side fills the channel window. More than `max_output` bytes (stdout and stderr together;
    default: the output limit setting) closes the channel and raises OutputTooLarge.
    """
    cap = output_limit() if max_output is None else max_output
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
                _check_size(client, command, out, err, cap)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
                _check_size(client, command, out, err, cap)
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


def output_limit() -> int:
    from django.conf import settings

    return int(settings.MUSTER.get("SSH_OUTPUT_LIMIT", DEFAULT_OUTPUT_LIMIT))


def _check_size(client: paramiko.SSHClient, command: str, out: bytearray, err: bytearray, cap: int) -> None:
    if len(out) + len(err) > cap:
        raise OutputTooLarge(
            f"a command on {_peer(client)} printed more than {cap} bytes, so it was stopped: {command[:60]!r}. "
            "Check that the login shell, ~/.bashrc or a ForceCommand on the host prints nothing by itself "
            "(MUSTER_SSH_OUTPUT_LIMIT sets the limit)"
        )


def put_file(
    client: paramiko.SSHClient,
    local: str | Path | bytes,
    remote_path: str,
    mode: int = 0o755,
    timeout: float = 30,
) -> None:
    """Copy a file (a path or the bytes themselves) over an exec channel, replacing `remote_path` atomically.

    No SFTP: many sshd setups leave out the sftp subsystem, and `cat` is everywhere. The data goes
    to a temporary name (created under umask 077, so nobody else can read it while it is written),
    its sha256 is checked on the host, and only then is it given `mode` and renamed into place, so a
    process reading the old file (for instance a running agent) never sees a half-written one.
    """
    data = local if isinstance(local, bytes) else Path(local).read_bytes()
    directory = posixpath.dirname(remote_path)
    tmp_path = posixpath.join(directory, f".{posixpath.basename(remote_path)}.{uuid.uuid4().hex}")
    digest = hashlib.sha256(data).hexdigest()
    tmp, final = shlex.quote(tmp_path), shlex.quote(remote_path)
    script = (
        f"umask 077; [ -d {shlex.quote(directory or '.')} ] || exit 71; "
        f"cat > {tmp} || {{ rm -f {tmp}; exit 72; }}; "
        f'[ "$(sha256sum {tmp} | cut -d" " -f1)" = {digest} ] || {{ rm -f {tmp}; exit 73; }}; '
        f"chmod {mode:o} {tmp} && mv -f {tmp} {final} || {{ rm -f {tmp}; exit 72; }}"
    )
    status, _out, err = run(client, script, timeout=timeout, stdin=data, max_output=64 << 10)
    where = f"{remote_path} on {_peer(client)}"
    if status == 71:
        raise SSHError(f"cannot write {where}: its directory does not exist")
    if status == 72:
        raise SSHError(f"cannot write {where}: {err.decode(errors='replace').strip()[-300:] or 'permission denied'}")
    if status == 73:
        raise SSHError(f"copying {where} arrived damaged (sha256 differs); try again")
    if status != 0:
        raise SSHError(f"copying {where} failed with status {status}: {err.decode(errors='replace')[-300:]}")
