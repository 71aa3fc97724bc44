"""`depends_on` between groups on the local backend: a group starts once the groups it names are
ready (exec probes that pass only once the node made its file) or done, read from the runners' own
start times and the jobs' `ready_at`."""

from __future__ import annotations

import pytest

from runs.services import logs
from runs.services.submission import submit_run
from tests.engine.helpers import Beat, local_project_fleet, wait_for_run
from tests.waiting import job_states

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DAG = """
type: task
name: dag
groups:
  - name: router
    depends_on: [decode, {group: loader, condition: done}]
    commands: ['echo "ROUTER_START $(python3 -c "import time; print(time.time())")"']
  - name: decode
    probes: [{type: exec, command: [test, -f, loaded], interval: 1s, timeout: 1s}]
    commands:
      - sleep 2
      - touch loaded
      - sleep 8
  - name: loader
    commands: [sleep 3]
"""


def test_a_group_starts_after_the_groups_it_depends_on_are_ready_and_done(fast_limits, celery_worker):
    fleet = local_project_fleet(size=3)
    with Beat():
        run = submit_run(fleet.project, None, {"configuration": DAG})
        run = wait_for_run(run.name, timeout=60)
    assert run.status == "done", job_states(run)
    router, decode, loader = run.current_jobs()
    assert decode.ready_at is not None and decode.ready_at.timestamp() <= router.start_time
    assert router.start_time >= decode.start_time + 2, "not before decode's probe could pass"
    assert loader.end_time is not None and router.start_time >= loader.end_time, "not before loader was done"
    assert "ROUTER_START" in logs.read(router).decode()
    from events.models import Event

    waits = list(Event.objects.filter(job=router, message__startswith="waiting for").values_list("message", flat=True))
    assert waits and waits[0].startswith("waiting for group decode to be ready"), waits
