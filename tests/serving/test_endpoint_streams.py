"""The endpoint (a real process) with a WebSocket through it, and a scale-to-zero service whose
first request waits for a replica instead of failing, counted meanwhile for the scaler."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import pytest
import requests
from django.db import transaction
from django.utils import timezone

from tests.serving.replicas import answer
from tests.serving.test_endpoint import endpoint, make_service, port, replicas, url  # noqa: F401 (fixtures)
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_websocket_passes_both_ways(endpoint, replicas, port):  # noqa: F811
    (a,) = replicas("a")
    make_service("chat", [a], port, auth=False)

    async def talk():
        async with aiohttp.ClientSession() as session, session.ws_connect(url(endpoint, "chat", "ws")) as ws:
            got = []
            for word in ("hello", "again"):
                await ws.send_str(word)
                got.append((await ws.receive(timeout=10)).data)
            return got

    assert asyncio.run(talk()) == ["a:hello", "a:again"]

    async def shout():  # past MUSTER_ENDPOINT_MAX_BODY (1 MiB here): closed as too big, not held and passed
        async with aiohttp.ClientSession() as session, session.ws_connect(url(endpoint, "chat", "ws")) as ws:
            try:
                await ws.send_str("x" * (2 << 20))
            except ConnectionError:
                # the endpoint closed (1009) and dropped the socket while the client still wrote the
                # message's tail: on a slow machine the close can come before the last write
                return "closed while sending"
            return await ws.receive(timeout=10)

    got = asyncio.run(shout())
    assert got == "closed while sending" or (
        got.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED) and got.data == 1009), got


def test_a_scale_to_zero_service_holds_the_first_request_until_a_replica_is_ready(endpoint, replicas, port):  # noqa: F811
    from instances.models import Instance
    from runs.models import Job
    from serving.rows import notify_routes
    from serving.stats import requests_total

    (a,) = replicas("a")
    run = make_service("sleepy", [], port, auth=False, minimum=0)
    result = {}

    def ask():
        started = time.monotonic()
        got = requests.get(url(endpoint, "sleepy"), timeout=60)
        result.update(status=got.status_code, replica=answer(got).get("replica"), waited=time.monotonic() - started)

    asker = threading.Thread(target=ask)
    asker.start()
    # counted while it waits: what the scaler's rps reads to start the first replica
    wait_until(lambda: requests_total(run.id) == 1, timeout=10, what="the waiting request counted")
    assert asker.is_alive(), result
    with transaction.atomic():
        host = Instance.objects.create(project=run.project, name="sleepy-0", backend="local", status="busy",
                                       hostname=a.host)
        Job.objects.create(run=run, job_num=0, node_group_name="0", spec={}, status="running", instance=host,
                           ready_at=timezone.now())
        notify_routes(run.id)
    asker.join(30)
    assert result["status"] == 200 and result["replica"] == "a", result  # held, not refused, until a replica


@pytest.fixture
def endpoint_on_a_timer(db, tmp_path):
    """An endpoint that re-reads its table every second: what SQLite has instead of NOTIFY, and
    the safety net under it (a notification lost while the LISTEN connection was down)."""
    from django.db import connection

    from tests.serving.replicas import Endpoint

    if connection.vendor != "postgresql":
        pytest.skip("the endpoint subprocess reads the test database by URL: PostgreSQL's")
    settings = connection.settings_dict
    url = f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"
    proc = Endpoint(url, {"MUSTER_ENDPOINT_ROUTES_REFRESH": "1"}, log=tmp_path / "endpoint.log")
    yield proc
    proc.stop()


def test_without_a_notification_the_timer_brings_the_change_and_a_stop_empties_the_pool(
        endpoint_on_a_timer, replicas, port):  # noqa: F811
    from runs.models import Job, Run

    a, b = replicas("a", "b")
    run = make_service("quiet", [a, b], port, auth=False, ready={"a"})
    assert {answer(requests.get(url(endpoint_on_a_timer, "quiet"), timeout=10))["replica"] for _ in range(4)} == {"a"}
    Job.objects.filter(run=run, instance__hostname=b.host).update(ready_at=timezone.now())  # no notify_routes
    wait_until(lambda: "b" in {requests.get(url(endpoint_on_a_timer, "quiet"), timeout=10).json()["replica"]
                               for _ in range(4)}, timeout=10, what="b in the pool by the timer")
    Run.objects.filter(pk=run.pk).update(stop_requested="stop")  # a stop drains: out of the pool first
    wait_until(lambda: requests.get(url(endpoint_on_a_timer, "quiet"), timeout=10).status_code == 503, timeout=10,
               what="no replica once the run is asked to stop")
