"""The services endpoint as a process (`python -m django serve_endpoint`) against the test database,
in front of real replica servers: spread over ready replicas only, auth by a project member's API
token, a refusing replica skipped, SSE as sent, the pool following PostgreSQL's NOTIFY without a
restart, and hostile requests refused before any replica is touched.

The service rows are made with the ORM, as the engine would leave them (running, ready jobs on
instances whose address is the replica's); the submission of a service is svc-config's, placing
replicas svc-engine's.
"""

from __future__ import annotations

import http.client
import socket
import time

import pytest
import requests
from django.db import connection, transaction
from django.utils import timezone

from tests.conftest import token_for
from tests.serving.replicas import NET, Endpoint, Replica, answer, free_port
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def endpoint(db, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the endpoint's notifications are PostgreSQL's (SQLite: the timer, tested apart)")
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    # a long timer: what changes the pool within a test is the notification
    proc = Endpoint(url, {"MUSTER_ENDPOINT_ROUTES_REFRESH": "60", "MUSTER_ENDPOINT_CLIENT_TIMEOUT": "2",
                          "MUSTER_ENDPOINT_MAX_BODY": str(1 << 20), "MUSTER_ENDPOINT_READ_TIMEOUT": "3",
                          "MUSTER_ENDPOINT_AUTH_CACHE": "0.5"}, log=tmp_path / "endpoint.log")
    yield proc
    proc.stop()


@pytest.fixture
def port():
    return free_port()


@pytest.fixture
def replicas(port):
    made = []

    def make(*names):
        for name in names:
            made.append(Replica(name, f"{NET}.{len(made) + 2}", port))
        return made[-len(names):]

    yield make
    for replica in made:
        replica.stop()


def make_service(name: str, replicas, port: int, *, project: str = "main", auth: bool = True, ready=None,
                 strip_prefix: bool = True, minimum: int | None = None):
    """A running service whose jobs run on instances at the replicas' addresses (ready: the names of
    the ready ones; all by default)."""
    from instances.models import Instance
    from projects.models import Project
    from runs.models import Job, Run

    proj, _ = Project.objects.get_or_create(name=project)
    count = len(replicas)
    conf = {"type": "service", "name": name, "port": port, "auth": auth, "strip_prefix": strip_prefix,
            "groups": [{"name": "0", "replicas": {"min": count if minimum is None else minimum, "max": max(count, 1)}}]}
    run = Run.objects.create(project=proj, name=name, configuration=conf, status="running")
    for i, replica in enumerate(replicas):
        host = Instance.objects.create(project=proj, name=f"{name}-{i}", backend="local", status="busy",
                                       hostname=replica.host)
        is_ready = ready is None or replica.name in ready
        Job.objects.create(run=run, job_num=i, node_group_name="0", spec={}, status="running", instance=host,
                           replica_num=i, ready_at=timezone.now() if is_ready else None)
    return run


def set_ready(run, replica_host: str, ready: bool):
    """What the engine does when a probe passes or fails: ready_at, and the notification, in one commit."""
    from runs.models import Job
    from serving.rows import notify_routes

    with transaction.atomic():
        Job.objects.filter(run=run, instance__hostname=replica_host).update(ready_at=timezone.now() if ready else None)
        notify_routes(run.id)


def url(endpoint, run_name: str, path: str = "who", project: str = "main") -> str:
    return f"{endpoint.url}/proxy/services/{project}/{run_name}/{path}"


def test_two_ready_replicas_are_both_reached_and_a_not_ready_one_never(endpoint, replicas, port):
    a, b, c = replicas("a", "b", "c")
    make_service("two", [a, b, c], port, auth=False, ready={"a", "b"})
    seen = [answer(requests.get(url(endpoint, "two"), timeout=10)).get("replica") for _ in range(20)]
    assert set(seen) == {"a", "b"}, seen
    assert c.hits == 0
    got = answer(requests.get(url(endpoint, "two", "v1/models?x=1"), timeout=10))
    assert got["path"] == "/v1/models?x=1"  # strip_prefix: the replica sees its own paths
    assert requests.get(url(endpoint, "two", "")[:-1], allow_redirects=False, timeout=10).status_code == 308
    head = requests.head(url(endpoint, "two"), timeout=10)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) > 0 and head.content == b""
    for _ in range(3):  # the kept connections still answer after a HEAD and a body of each kind
        assert requests.post(url(endpoint, "two", "echo"), data=b"z" * 70000, timeout=10).json()["body_length"] == 70000
        assert requests.get(url(endpoint, "two", "sse"), timeout=10).text.count("data:") == 3


def test_auth_needs_a_member_token_and_nothing_of_muster_reaches_the_replica(endpoint, replicas, port, make_user):
    (a,) = replicas("a")
    make_service("secret", [a], port, auth=True)
    member = token_for(make_user("member", project="main", role="user"))
    outsider = token_for(make_user("outsider", project="other", role="admin"))
    assert requests.get(url(endpoint, "secret"), timeout=10).status_code == 401
    assert requests.get(url(endpoint, "secret"), headers={"Authorization": "Bearer mst_nonsense"},
                        timeout=10).status_code == 401
    assert requests.get(url(endpoint, "secret"), headers={"Authorization": f"Bearer {outsider}"},
                        timeout=10).status_code == 403
    assert requests.get(url(endpoint, "secret") + f"?token={member}", timeout=10).status_code == 400
    assert a.hits == 0, "refused before any replica was touched"
    got = requests.get(url(endpoint, "secret"), timeout=10, headers={
        "Authorization": f"Bearer {member}", "Cookie": "sessionid=s3cret; csrftoken=c; app=kept",
        "X-Muster-Anything": "1"})
    assert got.status_code == 200, got.text
    seen = {k.lower(): v for k, v in got.json()["headers"].items()}
    assert "authorization" not in seen and "x-muster-anything" not in seen
    assert seen["cookie"] == "app=kept"
    open_run = make_service("open", [a], port, auth=False)
    got = requests.get(url(endpoint, "open"), headers={"Authorization": "Bearer app-own"}, timeout=10)
    assert got.status_code == 200 and got.json()["headers"]["Authorization"] == "Bearer app-own"
    assert open_run.project.name == "main"
    got = requests.get(url(endpoint, "open", "cookies"), timeout=10)
    assert got.raw.headers.getlist("Set-Cookie") == ["app=1; Path=/"]  # none for the console or other hosts
    # which services exist is told to members only: without a token an unknown name is a 401 too
    assert requests.get(url(endpoint, "nosuch"), timeout=10).status_code == 401
    assert requests.get(url(endpoint, "nosuch"), headers={"Authorization": "Bearer mst_nonsense"},
                        timeout=10).status_code == 401
    assert requests.get(url(endpoint, "nosuch"), headers={"Authorization": f"Bearer {member}"},
                        timeout=10).status_code == 404


def test_another_projects_service_is_not_reached_with_this_projects_token(endpoint, replicas, port, make_user):
    a, b = replicas("a", "b")
    make_service("same", [a], port, project="main", auth=True)
    make_service("same", [b], port, project="other", auth=True)
    member = token_for(make_user("member", project="main", role="user"))
    headers = {"Authorization": f"Bearer {member}"}
    assert requests.get(url(endpoint, "same", project="other"), headers=headers, timeout=10).status_code == 403
    assert requests.get(url(endpoint, "same", project="main"), headers=headers, timeout=10).json()["replica"] == "a"
    for sneaky in ("../../other/same/who", "..%2f..%2fother%2fsame%2fwho", "%2e%2e/%2e%2e/other/same/who",
                   "x%2F..%2F..%2Fother", "./../../other/same/who", "a\\..\\..\\other"):
        # as sent, not as a client library would tidy it
        raw = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=10)
        raw.request("GET", f"/proxy/services/main/same/{sneaky}", headers=headers)
        got = raw.getresponse()
        assert got.status == 400, (sneaky, got.status, got.read())
        raw.close()
    assert b.hits == 0


def test_a_replica_refusing_connections_costs_no_request(endpoint, replicas, port):
    a, b = replicas("a", "b")
    make_service("flaky", [a, b], port, auth=False)
    assert answer(requests.get(url(endpoint, "flaky"), timeout=10))["replica"] in ("a", "b")
    b.stop()  # the engine has not noticed: b is still "ready" in the table
    session = requests.Session()
    for _ in range(30):
        got = session.get(url(endpoint, "flaky"), timeout=10)
        assert got.status_code == 200 and got.json()["replica"] == "a", got.text
    for _ in range(5):
        assert session.post(url(endpoint, "flaky"), data=b"x" * 100, timeout=10).status_code == 200


def test_the_pool_follows_the_notification_without_a_restart_and_none_ready_is_a_503(endpoint, replicas, port):
    a, b = replicas("a", "b")
    run = make_service("moving", [a, b], port, auth=False, ready={"a"})
    assert {answer(requests.get(url(endpoint, "moving"), timeout=10))["replica"] for _ in range(6)} == {"a"}
    set_ready(run, b.host, True)
    wait_until(lambda: {requests.get(url(endpoint, "moving"), timeout=10).json()["replica"]
                        for _ in range(6)} == {"a", "b"}, timeout=10, what="b in the pool after the notification")
    set_ready(run, a.host, False)
    set_ready(run, b.host, False)
    wait_until(lambda: requests.get(url(endpoint, "moving"), timeout=10).status_code == 503, timeout=10,
               what="no replica after the notification")
    got = requests.get(url(endpoint, "moving"), timeout=10)
    assert "no ready replica" in got.json()["detail"]


def test_server_sent_events_arrive_as_sent(endpoint, replicas, port):
    (a,) = replicas("a")
    make_service("stream", [a], port, auth=False)
    requests.get(url(endpoint, "stream"), timeout=10)  # the table loaded
    with requests.get(url(endpoint, "stream", "sse"), stream=True, timeout=10) as got:
        assert got.headers["Content-Type"].startswith("text/event-stream")
        arrivals = []
        for line in got.iter_lines(chunk_size=1):
            if line.startswith(b"data:"):
                sent = float(line.split()[2])
                arrivals.append(time.time() - sent)
    assert len(arrivals) == 3
    # each event comes when sent (0.5 s apart at the replica), not when the stream ends
    assert max(arrivals) < 0.25, arrivals


def test_hostile_requests_get_clear_answers(endpoint, replicas, port):
    (a,) = replicas("a")
    make_service("target", [a], port, auth=False)
    assert requests.post(url(endpoint, "target", "echo"), data=b"x" * (2 << 20), timeout=30).status_code == 413

    def chunked():
        for _ in range(40):
            yield b"y" * 65536
    assert requests.post(url(endpoint, "target", "echo"), data=chunked(), timeout=30).status_code == 413
    assert requests.get(url(endpoint, "target"), headers={"X-Big": "z" * 20000}, timeout=10).status_code in (400, 431)
    assert requests.get(url(endpoint, "target", "malformed"), timeout=10).status_code == 502
    assert requests.get(url(endpoint, "target", "silent"), timeout=20).status_code == 504
    assert requests.get(url(endpoint, "nothing-here"), timeout=10).status_code == 401  # no token: names not told
    # a slowloris client: its half-sent headers hold one connection for the client timeout, then it is cut
    slow = socket.create_connection(("127.0.0.1", endpoint.port))
    slow.sendall(b"GET /proxy/services/main/target/who HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    started = time.monotonic()
    for _ in range(5):  # others are served meanwhile
        assert requests.get(url(endpoint, "target"), timeout=10).status_code == 200
    slow.settimeout(10)
    assert slow.recv(100) == b"", "the endpoint closes a connection whose headers never end"
    assert time.monotonic() - started < 8
    slow.close()
    # an endless answer streams (no buffering): the first bytes come at once
    with requests.get(url(endpoint, "target", "endless"), stream=True, timeout=10) as got:
        assert len(next(got.iter_content(4096))) > 0


def test_metrics_count_requests_errors_latency_and_ready_replicas(endpoint, replicas, port):
    from serving.stats import requests_total

    (a,) = replicas("a")
    run = make_service("measured", [a], port, auth=False)
    for _ in range(5):
        requests.get(url(endpoint, "measured"), timeout=10)
    text = requests.get(f"{endpoint.url}/metrics", timeout=10).text
    assert 'muster_service_requests_total{code="200",project="main",service="measured"} 5.0' in text
    assert 'muster_service_ready_replicas{project="main",service="measured"} 1.0' in text
    assert 'muster_service_first_byte_seconds_count{project="main",service="measured"} 5.0' in text
    wait_until(lambda: requests_total(run.id) == 5, timeout=10, what="the counts flushed for the scaler")
