"""A service rolled to a new deployment and scaled on its request rate, through the REST API with a
real worker on local hosts."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from engine import tasks
from events.models import Event
from runs.models import Job, Run
from serving.stats import add_requests
from tests.engine.helpers import BackgroundLoop, Beat
from tests.engine.service_helpers import apply_service, local_fleet, ready, replicas, service_yaml, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def three_hosts(fast_limits, settings):
    settings.MUSTER = {**settings.MUSTER, "DRAIN_DELAY": 1.0, "SCALING_INTERVAL": 0.5}
    fleet, end = local_fleet(3)
    yield fleet
    end()


class ReadyCounts(BackgroundLoop):
    """The service's ready replicas, sampled while the update runs."""

    interval = 0.1

    def __init__(self, name: str):
        super().__init__()
        self.name, self.seen = name, []

    def tick(self) -> None:
        self.seen.append(len(ready(self.name)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_rolling_update_ends_with_only_the_new_deployment_and_never_zero_ready(three_hosts, celery_worker, api,
                                                                                 tmp_path):
    apply_service(api, service_yaml("web", tmp_path))
    old = wait_until(lambda: (r := ready("web")) and len(r) == 2 and r, 60, "two replicas ready")
    old_pids = [int((Path(tmp_path) / j.instance.internal_ip / "pid").read_text()) for j in old]
    with ReadyCounts("web") as counts, Beat():
        apply_service(api, service_yaml("web", tmp_path).replace("VERSION=v1", "VERSION=v2"), update=True)
        assert Run.objects.get(name="web").deployment_num == 1

        def rolled():
            now = ready("web")
            return len(now) == 2 and len(replicas("web")) == 2 and all(j.deployment_num == 1 for j in replicas("web"))
        wait_until(rolled, 90, "both replicas of deployment 1 ready, none of deployment 0 left")
    assert counts.seen and min(counts.seen) >= 1, counts.seen
    assert not any(_alive(pid) for pid in old_pids), "the old deployment's processes are gone"
    for job in replicas("web"):
        assert (Path(tmp_path) / job.instance.internal_ip / "version").read_text().strip() == "v2"
    gone = Job.objects.filter(run__name="web", deployment_num=0)
    assert all(j.superseded and j.termination_reason == "terminated_by_server" for j in gone)
    said = list(Event.objects.filter(run__name="web").order_by("id").values_list("message", flat=True))
    assert sum("out of the endpoint's pool: rolled out" in m for m in said) == 2, said
    assert sum("rolling update to deployment 1" in m for m in said) >= 1, said
    assert Run.objects.get(name="web").status == "running"


class Scaler(BackgroundLoop):
    """Beat's scaling tick (muster/celery.py), sent to the worker every SCALING_INTERVAL."""

    interval = 0.5

    def tick(self) -> None:
        tasks.scale_services.apply_async(expires=5)


class Load(threading.Thread):
    """The endpoint's request counts as its processes flush them: `rps` requests a second, counted."""

    def __init__(self, run_id: int, rps: int):
        super().__init__(daemon=True)
        self.run_id, self.rps, self.stop = run_id, rps, threading.Event()

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.stop.wait(0.5):
                add_requests(self.run_id, self.rps // 2)
        finally:
            connection.close()


def test_rps_scaling_goes_up_from_zero_under_load_and_back_down_after_it(three_hosts, celery_worker, api, tmp_path):
    scaling = "scaling:\n  metric: rps\n  target: 5\n  window: 30s\n  scale_up_delay: 0s\n  scale_down_delay: 2s\n"
    apply_service(api, service_yaml("web", tmp_path, replicas="0..2", extra=scaling))
    run = wait_until(lambda: (r := Run.objects.get(name="web")).status == "running" and r, 30, "running at zero")
    assert not replicas("web") and run.desired_replicas == {"0": 0}
    with Scaler(), Beat():
        add_requests(run.pk, 1)  # one request waiting at the endpoint brings a replica up
        wait_until(lambda: len(ready("web")) == 1, 60, "one replica up for the first request")
        load = Load(run.pk, 20)
        load.start()
        try:
            wait_until(lambda: len(ready("web")) == 2, 60, "two replicas under 20 rps against a target of 5")
            assert Run.objects.get(name="web").desired_replicas == {"0": 2}
        finally:
            load.stop.set()
            load.join()
        wait_until(lambda: not replicas("web") and Run.objects.get(name="web").desired_replicas == {"0": 0}, 90,
                   "scaled back to zero once the window saw no request")
    said = list(Event.objects.filter(run__name="web").order_by("id").values_list("message", flat=True))
    assert any(m.startswith("scaled 0 0 → 1") for m in said), said
    assert any(m.startswith("scaled 0 1 → 2") and "rps against a target of 5" in m for m in said), said
    assert any(m.startswith("scaled 0 2 → 0") or m.startswith("scaled 0 2 → 1") for m in said), said
    assert Run.objects.get(name="web").status == "running", "a service at zero replicas still runs"
