"""Blocking HTTP from the server's worker (a Celery step) to a port of a replica: a router's worker
API, a worker's server info, a replica's Prometheus `/metrics`.

The replica is tried directly first: its instance's address (what the endpoint routes to) and the
port. An SSH fleet's host that cannot be reached that way (a firewall, a private network) is reached
as the endpoint reaches it (serving/proxy/tunnels.py): through the host's SSH connection, a
`direct-tcpip` channel to the host's own address (DSTACK_NODE_IP, what the replica binds); nothing
listens on the server. A host that needed SSH is tried through SSH first for PREFER seconds.

The address is held to the address policy the dstack gateway's forwards are (backends/ssh/
address_policy.py forward_policy: never the server's own addresses, loopback included, nor link-local
ones such as the cloud's metadata service; a local instance's address must be loopback, as
dstack_api/services/gateway.py address_refusal says): a host's name is the user's word and may
resolve anywhere, so it is resolved once, each address checked, and the socket connected to that
very address (then its peer checked again). An SSH host's own address (the SSH way) is the host's
to reach, over a connection itself held to the host policy (backends/ssh/connection.py).

Every request has a deadline (`timeout`, for the whole exchange) and a size cap (`max_bytes`, the
body): a replica is the user's code and may hang or answer forever. One request per connection
(`Connection: close`), since these are a few small requests per sync, not a stream.
"""

from __future__ import annotations

import ipaddress
import json as jsonlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

from backends.registry import LOCAL_HOSTS, address_policy

log = logging.getLogger(__name__)

PREFER = 60.0
HEAD_LIMIT = 64 * 1024  # status line and headers; their size is ours to bound, not the caller's
_prefer_ssh: dict[int, float] = {}
_clients: dict[int, object] = {}  # instance id -> paramiko client, kept while it lives
_lock = threading.Lock()


class ReplicaHTTPError(Exception):
    """The base of what `request` raises; the message names the replica, the port and the path."""


class ReplicaUnreachable(ReplicaHTTPError):
    """No answer: refused, timed out, cut short, no address, or no SSH path to its host."""


class ReplicaAnswerTooLarge(ReplicaHTTPError):
    """The answer's body (or head) is larger than the cap the caller gave."""


class ReplicaAnswerMalformed(ReplicaUnreachable):
    """An answer that is not HTTP as it should be (a status or a length that does not parse): as good as none."""


class ReplicaRequestRefused(ReplicaHTTPError):
    """Not sent: a path or a header that cannot be a request's bytes (printable ASCII, no spaces)."""


class _NotAllowed(OSError):
    """The address policy refuses the replica's address: nothing was connected to."""


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased; a repeated one: the last
    body: bytes = b""

    def json(self):
        """The body as JSON; ValueError when it is none (nested beyond the parser's depth included)."""
        try:
            return jsonlib.loads(self.body.decode("utf-8", "replace"))
        except RecursionError:
            raise ValueError("the answer's JSON is nested too deeply") from None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def request(job, port: int, method: str, path: str, *, json=None, headers: dict | None = None,
            timeout: float, max_bytes: int) -> Response:
    """`method path` to `port` of `job`'s instance; the answer, whatever its status.

    Raises ReplicaUnreachable (no answer within `timeout` by either way, an address the policy refuses,
    an answer that does not parse: ReplicaAnswerMalformed), ReplicaAnswerTooLarge, or ReplicaRequestRefused
    (a `path` or header that cannot be sent); all are ReplicaHTTPError.
    """
    instance = job.instance
    where = f"job {job.id} port {port} {method} {path}"
    if instance is None or not (instance.hostname or instance.internal_ip):
        raise ReplicaUnreachable(f"{where}: the job has no instance address yet")
    try:
        payload = _request_bytes(method, path, instance.hostname or instance.internal_ip, port, json, headers)
    except ValueError as exc:
        raise ReplicaRequestRefused(f"job {job.id} port {port}: {exc}") from None
    deadline = time.monotonic() + timeout
    ssh = _is_ssh(instance)
    ways = ["direct", "ssh"] if ssh else ["direct"]
    if ssh and _prefer_ssh.get(instance.id, 0.0) > time.monotonic():
        ways.reverse()
    errors = []
    for way in ways:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            conn = (_direct(instance, port, left) if way == "direct" else _through_ssh(instance, port, left))
        except OSError as exc:
            errors.append(f"{way}: {_describe(exc)}")
            continue
        if way == "ssh":
            _prefer_ssh[instance.id] = time.monotonic() + PREFER
        try:
            return _exchange(conn, payload, deadline, max_bytes, where)
        except OSError as exc:
            raise ReplicaUnreachable(f"{where}: {way}: {_describe(exc)}") from None
        except (ValueError, UnicodeError):  # what the checks in _parse_head and _length did not foresee
            raise ReplicaAnswerMalformed(f"{where}: {way}: an answer that does not parse as HTTP") from None
        finally:
            conn.close()
    raise ReplicaUnreachable(f"{where}: " + ("; ".join(errors) or "timed out"))


def _is_ssh(instance) -> bool:
    from instances.models import FleetBackend

    return instance.backend == FleetBackend.SSH


def _direct(instance, port: int, timeout: float):
    """A socket to the first address of the instance's host the policy allows that answers."""
    host = instance.hostname or instance.internal_ip
    # an SSH host keeps half the time for the SSH way: a firewall that drops packets would use it all
    connect_timeout = min(timeout, 5.0) if _is_ssh(instance) else timeout
    local = instance.backend == LOCAL_HOSTS
    policy = None if local else address_policy().forward_policy()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except UnicodeError:
        raise OSError(f"{host!r} is not a host name") from None
    addresses = list(dict.fromkeys((info[0], info[4]) for info in infos))
    reasons = [_refusal(sockaddr[0], policy) for _family, sockaddr in addresses]
    permitted = [a for a, why in zip(addresses, reasons, strict=True) if not why]
    if addresses and not permitted:
        raise _NotAllowed(f"not connecting to {host} ({addresses[0][1][0]}): {reasons[0]}")
    last: OSError = OSError(f"{host} has no address")
    for family, sockaddr in permitted:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(connect_timeout)
            sock.connect(sockaddr)
            # the kernel may connect elsewhere than asked (0.0.0.0 is a local address): checked again
            why = _refusal(sock.getpeername()[0], policy)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        if why:
            sock.close()  # before a byte is sent
            raise _NotAllowed(f"not connecting to {host} ({sockaddr[0]}): {why}")
        return sock
    raise last


def _refusal(address: str, policy) -> str:
    """Why not `address` ("" when it may be reached); `policy` None: a local instance's, loopback only."""
    if policy is not None:
        return address_policy().refusal(address, policy)
    ip = address_policy().forms(ipaddress.ip_address(address.split("%", 1)[0]))[0]
    return "" if ip.is_loopback else "a local instance's address must be loopback"


def _through_ssh(instance, port: int, timeout: float):
    """A channel to the replica's port at its host's own address, over the host's SSH connection."""
    from backends.ssh.connection import connect

    with _lock:
        client = _clients.get(instance.id)
    transport = client.get_transport() if client is not None else None
    if transport is None or not transport.is_active():
        try:
            client = connect(instance.ssh_target(), timeout=min(timeout, 10.0))
        except Exception as exc:  # SSHError and its kinds: the message says what to check
            raise ConnectionRefusedError(f"no SSH path to the host: {exc}") from None
        with _lock:
            old = _clients.pop(instance.id, None)
            _clients[instance.id] = client
        if old is not None:
            old.close()
        transport = client.get_transport()
    # only the host's own address: its loopback would reach the host's daemons, not the replica
    dest = (instance.internal_ip or instance.hostname, port)
    try:
        return transport.open_channel("direct-tcpip", dest, ("127.0.0.1", 0), timeout=min(timeout, 10.0))
    except Exception as exc:  # paramiko's ChannelException: refused at that address
        raise ConnectionRefusedError(f"refused at {dest[0]}:{port} through SSH: {exc}") from None


def forget_ssh(instance_id: int) -> None:
    """Close the SSH connection kept for an instance (its host went away)."""
    with _lock:
        client = _clients.pop(instance_id, None)
    _prefer_ssh.pop(instance_id, None)
    if client is not None:
        client.close()


def _request_bytes(method, path, host, port, json, headers) -> bytes:
    # a request line's bytes: printable ASCII only (anything else is %-escaped by whoever wrote it)
    if not path.startswith("/") or not all("!" <= c <= "~" for c in path):
        raise ValueError(f"bad request path {path[:100]!r}: printable ASCII without spaces, starting with /")
    body = b"" if json is None else jsonlib.dumps(json).encode()
    lines = {"Host": f"[{host}]:{port}" if ":" in host else f"{host}:{port}", "Connection": "close",
             "Accept": "application/json, text/plain, */*", "User-Agent": "muster"}
    if json is not None:
        lines["Content-Type"] = "application/json"
    if body or method in ("POST", "PUT", "PATCH"):
        lines["Content-Length"] = str(len(body))
    for name, value in (headers or {}).items():
        if not all(" " <= c <= "~" for c in f"{name}{value}"):
            raise ValueError(f"bad header {name[:100]!r}: printable ASCII only")
        lines[name] = value
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in lines.items()) + "\r\n"
    try:
        return head.encode("ascii") + body
    except UnicodeEncodeError:
        raise ValueError(f"bad host name {host[:100]!r}: ASCII only") from None


def _exchange(conn, payload: bytes, deadline: float, max_bytes: int, where: str) -> Response:
    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("timed out")
        return remaining

    conn.settimeout(left())
    conn.sendall(payload)
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > HEAD_LIMIT:
            raise ReplicaAnswerTooLarge(f"{where}: the answer's headers exceed {HEAD_LIMIT} bytes")
        conn.settimeout(left())
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionResetError("closed before an answer")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status, headers = _parse_head(head, where)
    length = _length(headers, where)
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    limit = max_bytes if chunked or length is None else length
    if not chunked and length is not None and length > max_bytes:
        raise ReplicaAnswerTooLarge(f"{where}: the answer's body is {length} bytes, more than {max_bytes}")
    body = bytearray(rest)
    # a chunked body carries its framing: allow it a little room over the cap, checked once decoded
    cap = limit + (4096 + max_bytes // 8 if chunked else 0)
    while len(body) < (limit if length is not None and not chunked else cap + 1):
        if chunked and body.endswith(b"0\r\n\r\n"):
            break
        conn.settimeout(left())
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    if length is not None and not chunked:
        if len(body) < limit:
            raise ConnectionResetError(f"cut short after {len(body)} of {limit} bytes")
        body = body[:limit]
    elif chunked:
        if len(body) > cap:
            raise ReplicaAnswerTooLarge(f"{where}: the answer's body is more than {max_bytes} bytes")
        body = _dechunk(bytes(body), where)
    if len(body) > max_bytes:
        raise ReplicaAnswerTooLarge(f"{where}: the answer's body is more than {max_bytes} bytes")
    return Response(status, headers, bytes(body))


def _parse_head(head: bytes, where: str) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    # "²".isdigit() is True: a status is three ASCII digits
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not (len(parts[1]) == 3 and parts[1].isascii()
                                                                   and parts[1].isdigit()):
        # the answer's own bytes are not echoed: whatever listens there is not shown through an event
        raise ReplicaAnswerMalformed(f"{where}: not an HTTP answer")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


def _length(headers: dict[str, str], where: str) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise ReplicaAnswerMalformed(f"{where}: a Content-Length that is not a number")
    return int(value)


def _dechunk(data: bytes, where: str) -> bytes:
    out, pos = bytearray(), 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            raise ReplicaUnreachable(f"{where}: a chunked answer cut short (or over the size cap)")
        try:
            size = int(data[pos:end].split(b";")[0], 16)
        except ValueError:
            raise ReplicaUnreachable(f"{where}: a bad chunk size in the answer") from None
        if size < 0:  # "-5" parses: it would step back and loop
            raise ReplicaAnswerMalformed(f"{where}: a bad chunk size in the answer")
        if size == 0:
            return bytes(out)
        out += data[end + 2:end + 2 + size]
        pos = end + 2 + size + 2
        if pos > len(data):
            raise ReplicaUnreachable(f"{where}: a chunked answer cut short (or over the size cap)")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
