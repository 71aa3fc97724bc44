"""admit_fleet (engine/admission.py) survives its messages lost and doubled (tests/engine/faults.py):
a waiting run on a full local fleet, a real Celery worker with two threads, the sweep as beat sends
it. The waiting job's own recheck is put far off (10 minutes), so what places the waiter is the
admission look: a lost look is made up by the sweep (the fleet's row counts a release nobody looked
at), a doubled one places the waiter once."""

from __future__ import annotations

import pytest
from django.db.models import F

from events.models import Event
from instances.models import FleetQueue, Instance
from runs.models import Run
from tests.engine.faults import celery_worker_parameters, celery_worker_pool, inject  # noqa: F401
from tests.engine.helpers import Beat, local_project_fleet, wait_for_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HOLDER = "type: task\nname: holder\nnodes: 2\ncommands: [sleep 347]\n"
WAITER = ("type: task\nname: waiter\nnodes: 2\ncommands: [echo waited]\n"
          "retry: {on_events: [no-capacity], duration: 1h}\n")


def _submit(api, conf: str) -> None:
    answer = api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
    assert answer.status_code == 201, answer.json()


def _waiter_waits_then_holder_stops(api) -> None:
    _submit(api, HOLDER)
    wait_for_run("holder", statuses=("running",), timeout=90)
    _submit(api, WAITER)
    wait_until(lambda: Run.objects.get(name="waiter").jobs.filter(waiting_for__startswith="a free host").exists(),
               timeout=30, what="the waiter to wait for a host")
    assert api.post("/api/projects/main/runs/holder/stop", {}, format="json").status_code in (200, 202)


@pytest.mark.parametrize("mode", ["drop", "twice"])
def test_admit_fleet_lost_or_doubled_still_places_the_waiter_once(fast_limits, celery_worker, superuser_api,
                                                                   monkeypatch, mode):
    fast_limits["WAITING_HOST_RECHECK"] = 600  # the waiter's own recheck would come far too late
    faulty = inject(monkeypatch, "admit_fleet", mode)
    local_project_fleet(size=2)
    with Beat():
        _waiter_waits_then_holder_stops(superuser_api)
        done = wait_for_run("waiter", timeout=90)
    assert faulty.injected >= 1, "a fault was injected"
    assert (done.status, done.submission_num) == ("done", 0), [(j.status, j.termination_message)
                                                                for j in done.current_jobs()]
    placed = Event.objects.filter(run=done, message__startswith="provisioning on")
    assert placed.count() == 2, list(placed.values_list("message", flat=True))  # one per node, once
    # every release was looked at (the waiter's own end too)
    wait_until(lambda: FleetQueue.objects.filter(admitted=F("wanted"), wanted__gte=1).exists(), timeout=30,
               what="the fleet's admission looks to catch up with its releases")
    assert not Instance.objects.filter(status="busy").exists()
