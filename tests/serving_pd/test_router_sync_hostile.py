"""sync_routers against routers that are the user's code and answer what they like (no smg needed: a
fake worker API on a loopback address of its own, run in the test process): entries of the wrong
shape, a list of thousands of unknown workers, answers whose bodies must not reach an event, a
router that stops answering while a drained worker waits for it, and beat's sweep sending one
message per service instead of syncing them all in its own task."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from django.utils import timezone

from engine import router_sync
from engine.tuning import ROUTER_REMOVALS_PER_SYNC
from events.models import Event
from instances.models import Instance
from projects.models import Project
from runs.models import Job, Run
from serving.models import RouterSync
from serving.router_sync import still_listed
from tests.serving_pd.processes import address, free_port

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "root:x:0:0:do-not-echo"


class FakeRouter:
    """smg's worker API as a hostile router may answer it: GET /workers answers `listing` (an object,
    sent as JSON, or bytes as they are); POST and DELETE answer `status` with `body`; every request
    recorded as (method, path)."""

    def __init__(self, host: str, port: int):
        self.listing: object = {"workers": []}
        self.status, self.body = 202, b'{"worker_id": "w-1"}'
        self.requests: list[tuple[str, str]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, status: int, body: bytes):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                fake.requests.append(("GET", self.path))
                listing = fake.listing
                self._answer(200, listing if isinstance(listing, bytes) else json.dumps(listing).encode())

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fake.requests.append(("POST", self.path))
                self._answer(fake.status, fake.body)

            def do_DELETE(self):
                fake.requests.append(("DELETE", self.path))
                self._answer(fake.status, fake.body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def sent(self, method: str) -> list[str]:
        return [path for m, path in self.requests if m == method]


@pytest.fixture
def routers():
    made: list[FakeRouter] = []

    def make(host: str, port: int) -> FakeRouter:
        made.append(FakeRouter(host, port))
        return made[-1]

    yield make
    for router in made:
        router.close()


def _service(port: int, routers: int = 1) -> tuple[Run, list[Job], Job]:
    """A PD service: `routers` ready router replicas at address(10 + i), one ready decode worker at
    address(20) (nothing listens there: its role is its group's name)."""
    project, _ = Project.objects.get_or_create(name="main")
    conf = {"type": "service", "name": "pd", "port": port, "auth": False,
            "groups": [{"name": "router", "router": "smg", "replicas": {"min": routers, "max": routers}},
                       {"name": "decode", "replicas": {"min": 1, "max": 1}}]}
    run = Run.objects.create(project=project, name="pd", configuration=conf, status="running")

    def job(num: int, group: str, replica: int, host: str) -> Job:
        instance = Instance.objects.create(project=project, name=f"pd-{num}", backend="local", status="busy",
                                           hostname=host, internal_ip=host)
        return Job.objects.create(run=run, job_num=num, node_group_name=group, replica_num=replica, spec={},
                                  status="running", instance=instance, ready_at=timezone.now())

    made = [job(i, "router", i, address(10 + i)) for i in range(routers)]
    return run, made, job(routers, "decode", 0, address(20))


def _events(run: Run) -> list[str]:
    return list(Event.objects.filter(run_id=run.pk).order_by("id").values_list("message", flat=True))


def test_entries_of_the_wrong_shape_and_a_nested_answer_stop_neither_that_router_nor_the_next(sent, routers):
    port = free_port(address(10))
    run, (first, second), decode = _service(port, routers=2)
    bad = routers(address(10), port)
    good = routers(address(11), port)
    bad.listing = {"workers": [
        {"id": "a1", "url": "http://elsewhere:1", "labels": ["muster.job", "1"]},  # labels a list
        {"id": "a2", "url": 5, "labels": "muster.job=1", "worker_type": ["decode"]},  # a string, a number
        {"id": {"x": 1}, "url": None, "labels": {"muster.job": "x" * 40}, "bootstrap_port": "9"},
        "not an entry", 7, None,
    ]}
    router_sync.sync_routers(run.pk)
    assert sorted(bad.sent("DELETE")) == ["/workers/a1", "/workers/a2"], "the wrong-shaped entries, by their ids"
    assert bad.sent("POST") == ["/workers"] and good.sent("POST") == ["/workers"], "each router got the decode"
    row = RouterSync.objects.get(pk=run.pk)
    assert row.listed[str(second.pk)] == {str(decode.pk): "w-1"}

    bad.listing = b"[" * 100000 + b"]" * 100000  # deeper than the JSON parser goes
    good.requests.clear()
    RouterSync.objects.filter(pk=run.pk).update(attempts={})
    router_sync.sync_routers(run.pk)
    assert good.sent("GET") == ["/workers"], "the next router is synced all the same"
    assert any("refuses the worker API: GET /workers answered 200" in m for m in _events(run)), _events(run)


def test_a_router_listing_thousands_of_unknown_workers_costs_a_bounded_sync_and_one_event(sent, routers):
    port = free_port(address(10))
    run, (router,), decode = _service(port)
    fake = routers(address(10), port)
    url = "http://" + "h" * 1000 + ":1"  # within the list cap: 1000 entries of 1 kB
    fake.listing = {"workers": [{"id": f"u{i}", "url": url, "worker_type": "regular"} for i in range(1000)]}
    fake.status, fake.body = 200, b"{}"
    router_sync.sync_routers(run.pk)
    assert len(fake.sent("DELETE")) == ROUTER_REMOVALS_PER_SYNC
    removed = [m for m in _events(run) if "removed" in m]
    assert len(removed) == 1, removed
    assert f"removed {ROUTER_REMOVALS_PER_SYNC} worker(s) Muster did not register" in removed[0]
    assert f"{1000 - ROUTER_REMOVALS_PER_SYNC} more to remove" in removed[0] and len(removed[0]) < 500
    assert all(len(m) < 1000 for m in _events(run)), "a router's strings are clipped in events"
    assert ("sync_routers", run.pk) not in sent.names(), "not looked at again at once for workers not Muster's"


def test_answer_bodies_never_reach_an_event(sent, routers):
    port = free_port(address(10))
    run, (router,), decode = _service(port)
    fake = routers(address(10), port)
    fake.listing = SECRET.encode()
    router_sync.sync_routers(run.pk)
    fake.listing = {"workers": []}
    fake.status, fake.body = 400, SECRET.encode()
    router_sync.sync_routers(run.pk)
    said = _events(run)
    assert any("GET /workers answered 200" in m for m in said) and any("POST /workers answered 400" in m
                                                                        for m in said), said
    assert not [m for m in said if "do-not-echo" in m], said


def test_a_router_that_stops_answering_still_lists_what_it_listed_and_one_never_heard_lists_all(sent, routers):
    port = free_port(address(10))
    run, (router,), decode = _service(port)
    fake = routers(address(10), port)
    router_sync.sync_routers(run.pk)
    fake.listing = {"workers": [{"id": "w-1", "url": f"http://{address(20)}:{port}", "worker_type": "decode",
                                 "labels": {"muster.job": str(decode.pk)}}]}
    router_sync.sync_routers(run.pk)
    assert still_listed(run.pk, decode.pk) == [str(router.pk)]

    Job.objects.filter(pk=decode.pk).update(drain_at=timezone.now())
    fake.close()  # gone before it was told: the drained worker must wait for it (bounded), not stop at once
    router_sync.sync_routers(run.pk)
    assert still_listed(run.pk, decode.pk) == [str(router.pk)]
    assert any("cannot be reached for its worker list" in m for m in _events(run))

    RouterSync.objects.filter(pk=run.pk).update(listed={})  # a router never heard from
    router_sync.sync_routers(run.pk)
    assert still_listed(run.pk, decode.pk) == [str(router.pk)], "it may list anything: counted as listing it"


def test_the_sweep_sends_one_message_per_routed_service_and_syncs_none_itself(sent, routers):
    port = free_port(address(10))
    run, (router,), decode = _service(port)
    fake = routers(address(10), port)
    assert router_sync.sweep_routers() == 1
    assert sent.names() == [("sync_routers", run.pk)]
    assert fake.requests == [] and not RouterSync.objects.filter(pk=run.pk, synced_at__isnull=False).exists()
