"""The sync_routers step survives its messages lost and doubled (tests/engine/faults.py): a PD
service (the real smg router, stand-in workers: test_pd_service.pd_yaml) on a local fleet, a real
Celery worker with two threads, beat's sweep_routers sent as beat sends it. A lost message is made
up by the sweep; a doubled one adds no worker twice, in smg or in the run's events."""

from __future__ import annotations

import time

import pytest

from events.models import Event
from runs.models import Run
from tests.engine.faults import celery_worker_parameters, celery_worker_pool, inject  # noqa: F401
from tests.engine.helpers import BackgroundLoop, local_project_fleet
from tests.engine.service_helpers import ready, wait_until
from tests.serving.replicas import free_port
from tests.serving_pd.processes import listed, workers
from tests.serving_pd.test_pd_service import pd_yaml

pytestmark = [pytest.mark.smg, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class RouterBeat(BackgroundLoop):
    """Beat's `routers` entry (muster/celery.py), with its options, every `interval` seconds: the
    test's stand-in for MUSTER_ROUTER_SYNC_INTERVAL (tests/engine/helpers.Beat sends only the sweep)."""

    def __init__(self, interval: float = 0.5):
        super().__init__()
        self.interval = interval

    def tick(self) -> None:
        from engine import tasks
        from muster.celery import app

        tasks.sweep_routers.apply_async(**app.conf.beat_schedule["routers"]["options"])


def _router(name: str):
    return next(j for j in ready(name) if j.node_group_name == "router")


def _expected(name: str, port: int) -> set[tuple[str, str]]:
    """(url, role) of every ready worker of the run: what its router should list."""
    return {(f"http://{j.instance.internal_ip}:{port}", j.node_group_name) for j in ready(name)
            if j.node_group_name != "router"}


def _added(name: str) -> list[str]:
    return [m for m in Event.objects.filter(run__name=name).order_by("id").values_list("message", flat=True)
            if "added worker" in m]


def _apply(api, conf: str, update: bool = False) -> None:
    answer = api.post("/api/projects/main/runs/", {"configuration": conf, **({"update": True} if update else {})},
                      format="json")
    assert answer.status_code == (200 if update else 201), answer.json()


def test_a_lost_sync_routers_message_is_made_up_by_the_beat_sweep(
        fast_limits, celery_worker, superuser_api, monkeypatch, tmp_path):
    local_project_fleet(size=4)
    port = free_port()
    conf = pd_yaml("pd-drop", port, tmp_path)
    _apply(superuser_api, conf)
    wait_until(lambda: len(ready("pd-drop")) == 3, 40, "router, prefill and decode ready")
    router = _router("pd-drop").instance.internal_ip
    wait_until(lambda: listed(router, port) == _expected("pd-drop", port), 20, "smg lists prefill and decode")

    # a second decode: its readiness is the one change left, and its message the one lost
    faulty = inject(monkeypatch, "sync_routers", "drop")
    head, decode = conf.rsplit("replicas: 1", 1)  # the decode group's count is the last
    _apply(superuser_api, head + "replicas: 2" + decode, update=True)
    wait_until(lambda: len(ready("pd-drop")) == 4, 40, "the second decode ready")
    time.sleep(1.5)  # the worker had time to act on the message, had it come
    assert faulty.dropped == 1 and faulty.sent == 1, vars(faulty)
    assert len(listed(router, port)) == 2, "the message was lost and nothing else synced: smg is behind"

    with RouterBeat(interval=0.5):
        wait_until(lambda: listed(router, port) == _expected("pd-drop", port), 20,
                   "the sweep brings smg's list to the three ready workers")
    assert len(_expected("pd-drop", port)) == 3
    assert faulty.sent >= 2, "the sweep sent the step again"
    assert len(_added("pd-drop")) == 3, _added("pd-drop")


def test_doubled_sync_routers_messages_list_each_worker_once(
        fast_limits, celery_worker, superuser_api, monkeypatch, tmp_path):
    local_project_fleet(size=3)
    port = free_port()
    faulty = inject(monkeypatch, "sync_routers", "twice")
    with RouterBeat(interval=0.3):
        _apply(superuser_api, pd_yaml("pd-twice", port, tmp_path))
        wait_until(lambda: len(ready("pd-twice")) == 3, 40, "router, prefill and decode ready")
        router = _router("pd-twice").instance.internal_ip
        wait_until(lambda: listed(router, port) == _expected("pd-twice", port), 20, "smg lists prefill and decode")
        time.sleep(1.5)  # more doubled messages, from the sweep, while everything is in line
    assert faulty.doubled >= 2, vars(faulty)
    urls = [w["url"] for w in workers(router, port)]
    assert sorted(urls) == sorted(url for url, _ in _expected("pd-twice", port)), urls
    added = _added("pd-twice")
    assert len(added) == 2 and len({m for m in added}) == 2, added
    assert Run.objects.get(name="pd-twice").status == "running"
