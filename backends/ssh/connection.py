"""SSH transport for the ssh backend: log in to a host with a key held as text.

This module opens the connection (address policy, host key check or trust on first use, login)
and says who is at the other end; running commands over it is in `commands`, key text in `keys`,
the errors in `errors`. Every failure a user can fix is raised as an `SSHError` subclass whose
message names the host, the port and what to check, so the instances app can show it as-is.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass

import paramiko

from backends.ssh.address_policy import HostPolicy, host_policy, refusal
from backends.ssh.errors import (
    AuthenticationFailed,
    HostKeyMismatch,
    HostNotAllowed,
    HostUnreachable,
    SSHError,
)
from backends.ssh.keys import fingerprint, format_host_key, load_private_key, parse_host_key

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15


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


def _open_socket(target: SSHTarget, timeout: float) -> socket.socket:
    """A TCP connection to the first allowed address of the host that answers.

    Each resolved address is checked just before connecting to that very address, so a DNS answer
    cannot change between the check and the connection; and the address the socket is connected to
    is checked again, since the kernel may connect elsewhere than asked (0.0.0.0 becomes a local
    address).
    """
    policy = host_policy()
    try:
        infos = socket.getaddrinfo(target.hostname, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
        raise _unreachable(target, exc) from exc
    addresses = list(dict.fromkeys((info[0], info[4]) for info in infos))
    reasons = [refusal(sockaddr[0], policy) for _family, sockaddr in addresses]
    permitted = [a for a, why in zip(addresses, reasons, strict=True) if not why]
    if addresses and not permitted:
        raise _not_allowed(target, reasons[0])
    last: BaseException = OSError("no address")
    for family, sockaddr in permitted:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        _check_peer(target, sock, policy)
        return sock
    raise _unreachable(target, last) from last


def _check_peer(target: SSHTarget, sock: socket.socket, policy: HostPolicy) -> None:
    try:
        why = refusal(sock.getpeername()[0], policy)
    except OSError as exc:  # reset before we asked
        sock.close()
        raise _unreachable(target, exc) from exc
    if why:
        sock.close()  # before a byte is read: nothing at that address learns who connected
        raise _not_allowed(target, why)


def _not_allowed(target: SSHTarget, why: str) -> HostNotAllowed:
    return HostNotAllowed(
        f"{target.hostname}:{target.port} is not an address this server connects to: {why}; register a "
        "host on an allowed network"
    )


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


def peer(client: paramiko.SSHClient) -> str:
    """The other end of a connection as "host:port", for messages."""
    transport = client.get_transport()
    try:
        host, port = transport.getpeername()[:2] if transport else ("?", "?")
    except OSError:
        return "the host"
    return f"{host}:{port}"

