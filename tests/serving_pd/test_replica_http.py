"""serving/replica_http.py against real servers: a local replica reached directly (lengths, chunks,
caps, timeouts, refusals), and a replica only its SSH host reaches, through the host's connection."""

from __future__ import annotations

import socket
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from serving.replica_http import (
    ReplicaAnswerTooLarge,
    ReplicaHTTPError,
    ReplicaUnreachable,
    Response,
    request,
)
from tests.serving.replicas import free_port
from tests.waiting import wait_until


class RawServer:
    """A TCP server on loopback that answers every connection with `answer(request_bytes)`: the
    exact bytes a replica might send, including ones no well-behaved server sends."""

    def __init__(self, answer):
        self.answer, self.requests = answer, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(4096)
        head, _, body = data.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                while len(body) < int(line.split(b":")[1]):
                    body += conn.recv(4096)
        self.requests.append(head + b"\r\n\r\n" + body)
        try:
            for piece in self.answer(data):
                if isinstance(piece, float):
                    time.sleep(piece)
                else:
                    conn.sendall(piece)
        except OSError:
            pass
        conn.close()

    def close(self):
        self.sock.close()


def local_job(port_host="127.0.0.1"):
    return SimpleNamespace(id=1, instance=SimpleNamespace(id=1, backend="local", hostname=port_host,
                                                          internal_ip=port_host))


@pytest.fixture
def raw():
    servers = []

    def make(answer):
        servers.append(RawServer(answer))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def test_a_json_answer_with_a_length_and_the_request_as_sent(raw):
    server = raw(lambda req: [b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n'
                              b'{"a": [1]}\n'])
    got = request(local_job(), server.port, "POST", "/workers", json={"url": "http://x:1"},
                  headers={"Authorization": "Bearer t"}, timeout=5, max_bytes=100)
    assert got.status == 200 and got.ok and got.json() == {"a": [1]}
    assert got.headers["content-type"] == "application/json"
    sent = server.requests[0]
    assert sent.startswith(b"POST /workers HTTP/1.1\r\n")
    assert b"Authorization: Bearer t\r\n" in sent and sent.endswith(b'{"url": "http://x:1"}')


def test_a_chunked_answer_is_decoded_and_an_error_status_is_returned_not_raised(raw):
    server = raw(lambda req: [b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n", b"5\r\nhello\r\n",
                              0.05, b"6\r\n world\r\n0\r\n\r\n"])
    got = request(local_job(), server.port, "GET", "/health", timeout=5, max_bytes=100)
    assert got.status == 503 and not got.ok and got.body == b"hello world"


def test_an_answer_until_close_without_a_length(raw):
    server = raw(lambda req: [b"HTTP/1.0 200 OK\r\n\r\n", b"a" * 3000, b"b" * 3000])
    got = request(local_job(), server.port, "GET", "/metrics", timeout=5, max_bytes=10000)
    assert got.body == b"a" * 3000 + b"b" * 3000


@pytest.mark.parametrize("answer", [
    [b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", b"x" * 5000],  # said up front
    [b"HTTP/1.1 200 OK\r\n\r\n"] + [b"x" * 1000] * 50,  # until close
    [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"] + [b"3e8\r\n" + b"x" * 1000 + b"\r\n"] * 50,
    [b"HTTP/1.1 200 OK\r\n"] + [b"X-Pad: " + b"y" * 1000 + b"\r\n"] * 100,  # endless headers
])
def test_an_answer_over_the_cap_raises_too_large(raw, answer):
    server = raw(lambda req: answer)
    with pytest.raises(ReplicaAnswerTooLarge, match=f"port {server.port} GET /big"):
        request(local_job(), server.port, "GET", "/big", timeout=5, max_bytes=4000)


def test_a_replica_that_hangs_times_out_within_the_deadline(raw):
    server = raw(lambda req: [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345", 3.0, b"67890"])
    started = time.monotonic()
    with pytest.raises(ReplicaUnreachable, match="timed out"):
        request(local_job(), server.port, "GET", "/slow", timeout=0.5, max_bytes=100)
    assert time.monotonic() - started < 1.5


def test_refused_cut_short_and_not_http_are_unreachable(raw):
    with pytest.raises(ReplicaUnreachable, match="refused"):
        request(local_job(), free_port(), "GET", "/health", timeout=2, max_bytes=100)
    cut = raw(lambda req: [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n123"])
    with pytest.raises(ReplicaUnreachable, match="cut short"):
        request(local_job(), cut.port, "GET", "/health", timeout=2, max_bytes=100)
    garbage = raw(lambda req: [b"SSH-2.0-OpenSSH\r\n\r\n"])
    with pytest.raises(ReplicaUnreachable, match="not an HTTP answer"):
        request(local_job(), garbage.port, "GET", "/health", timeout=2, max_bytes=100)
    with pytest.raises(ReplicaUnreachable, match="no instance address"):
        request(SimpleNamespace(id=3, instance=None), 80, "GET", "/", timeout=2, max_bytes=100)


INNER = "10.254.0.2"  # the host's own address for the replica, routed nowhere from the server


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.django_db(transaction=True)
def test_a_replica_only_its_host_reaches_is_asked_through_the_hosts_ssh_connection(ssh_hosts, tmp_path):
    from instances.models import Fleet, Instance
    from projects.models import Project

    host = ssh_hosts(1, mode="netns")[0]
    port = free_port()
    (tmp_path / "get_server_info").write_text('{"disaggregation_mode": "prefill"}')
    host.netns_exec(["ip", "addr", "add", f"{INNER}/32", "dev", "lo"], check=True)
    server = host.netns_popen([sys.executable, "-m", "http.server", str(port), "--bind", INNER,
                               "--directory", str(tmp_path)])
    try:
        knock = f"import socket; socket.create_connection(('{INNER}', {port}), 2)"
        wait_until(lambda: host.netns_exec([sys.executable, "-c", knock], timeout=10).returncode == 0,
                   timeout=20, what="the replica listening on its host's own address")
        project, _ = Project.objects.get_or_create(name="main")
        fleet = Fleet.objects.create(project=project, name="hosts", backend="ssh", status="active")
        fleet.private_key = host.private_key
        fleet.save()
        instance = Instance.objects.create(project=project, fleet=fleet, name="hosts-0", backend="ssh",
                                           status="busy", hostname=host.address, port=host.port,
                                           internal_ip=INNER, username=host.user, host_key=host.host_key)
        job = SimpleNamespace(id=9, instance=instance)
        got = request(job, port, "GET", "/get_server_info", timeout=20, max_bytes=1000)
        assert got.status == 200 and got.json() == {"disaggregation_mode": "prefill"}
        with pytest.raises(ReplicaUnreachable, match="refused"):  # nothing there, by either way
            request(job, free_port(), "GET", "/get_server_info", timeout=20, max_bytes=1000)
    finally:
        server.kill()
        server.wait(10)


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
    "HTTP/1.1 2\u00b2 OK\r\nContent-Length: 2\r\n\r\n".encode("latin-1"),  # "²".isdigit() is True
    b"HTTP/1.1 99999999999999999999 OK\r\nContent-Length: 2\r\n\r\n",
])
def test_an_answer_that_does_not_parse_is_unreachable_not_a_crash(raw, head):
    server = raw(lambda req: [head, b"{}"])
    with pytest.raises(ReplicaUnreachable, match=f"port {server.port} GET /x"):
        request(local_job(), server.port, "GET", "/x", timeout=2, max_bytes=100)


@pytest.mark.parametrize("path", ["/\u6307\u6807", "/m\x7f", "/a\tb", "metrics"])
def test_a_path_that_cannot_be_a_request_line_is_refused_before_any_connection(raw, path):
    server = raw(lambda req: [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"])
    with pytest.raises(ReplicaHTTPError, match="request path"):
        request(local_job(), server.port, "GET", path, timeout=2, max_bytes=100)
    assert server.requests == []


def test_json_nested_beyond_the_parsers_depth_is_a_value_error():
    with pytest.raises(ValueError):
        Response(200, {}, b"[" * 200000 + b"]" * 200000).json()


@pytest.mark.parametrize(("backend", "host", "why"), [
    # a cloud or SSH host's name is the user's word: a name that resolves to the server itself
    ("aws", "localhost", "address of the Muster server itself"),
    ("aws", "127.0.0.1", "address of the Muster server itself"),
    ("aws", "169.254.169.254", "network the operator denies"),  # the cloud's metadata service
    ("local", "10.1.2.3", "local instance's address must be loopback"),
])
def test_an_address_the_policy_refuses_is_never_connected_to(raw, backend, host, why):
    server = raw(lambda req: [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"])
    job = SimpleNamespace(id=5, instance=SimpleNamespace(id=5, backend=backend, hostname=host, internal_ip=host))
    started = time.monotonic()
    with pytest.raises(ReplicaUnreachable, match=why):
        request(job, server.port, "GET", "/workers", timeout=5, max_bytes=100)
    assert time.monotonic() - started < 1 and server.requests == []


def test_a_negative_chunk_size_is_malformed_not_a_loop(raw):
    server = raw(lambda req: [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n"])
    with pytest.raises(ReplicaUnreachable, match="bad chunk size"):
        request(local_job(), server.port, "GET", "/x", timeout=2, max_bytes=100)
