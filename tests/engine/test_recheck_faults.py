"""recheck_jobs (engine/submitted/provision.py, the sweep's rechecks of waiting jobs as one step)
survives its messages lost and doubled (tests/engine/faults.py): a run waits for a host of a local
fleet whose hosts are busy, then they come back idle without any job's end (as a host back from
unreachable does), so no release sends the fleet's look: only the sweep's recheck finds them, and
asks the look, which places the run. A real Celery worker with two threads; the sweep as beat sends it."""

from __future__ import annotations

import pytest

from events.models import Event
from runs.models import Run
from tests.engine.faults import celery_worker_parameters, celery_worker_pool, inject  # noqa: F401
from tests.engine.helpers import Beat, local_project_fleet, wait_for_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WAITER = ("type: task\nname: waiter\nnodes: 2\ncommands: [echo waited]\n"
          "retry: {on_events: [no-capacity], duration: 1h}\n")


@pytest.mark.parametrize("mode", ["drop", "twice"])
def test_recheck_jobs_lost_or_doubled_still_places_the_waiter_once(fast_limits, celery_worker, superuser_api,
                                                                   monkeypatch, mode):
    faulty = inject(monkeypatch, "recheck_jobs", mode)
    fleet = local_project_fleet(size=2)
    fleet.instances.update(status="busy")  # busy with nothing that will end and give them back
    with Beat():
        answer = superuser_api.post("/api/projects/main/runs/", {"configuration": WAITER}, format="json")
        assert answer.status_code == 201, answer.json()
        wait_until(lambda: Run.objects.get(name="waiter").jobs.filter(waiting_for__startswith="a free host").exists(),
                   timeout=30, what="the waiter to wait for a host")
        fleet.instances.update(status="idle")  # back without a release: no look is sent
        done = wait_for_run("waiter", timeout=90)
    assert faulty.injected >= 1, "a fault was injected"
    assert (done.status, done.submission_num) == ("done", 0), [(j.status, j.termination_message)
                                                                for j in done.current_jobs()]
    placed = Event.objects.filter(run=done, message__startswith="provisioning on")
    assert placed.count() == 2, list(placed.values_list("message", flat=True))  # one per node, once
