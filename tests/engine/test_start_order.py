"""startup_order and stop_criteria, checked from the start times the runner recorded."""

from __future__ import annotations

import pytest

from instances.models import Instance
from runs.services.submission import submit_run
from tests.engine.helpers import Beat, job_summary, local_project_fleet, runner_processes, wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

THREE = """
type: task
name: order-{order}
nodes: 3
startup_order: {order}
commands:
  - sleep 0.3
"""


@pytest.mark.parametrize("order", ["any", "master-first", "workers-first"])
def test_startup_order_is_visible_in_the_runners_start_times(order, fast_limits, celery_worker):
    fleet = local_project_fleet(size=3)
    with Beat():
        run = submit_run(fleet.project, None, {"configuration": THREE.format(order=order)})
        run = wait_for_run(run.name, timeout=60)
    assert run.status == "done", job_summary(run)
    master, *workers = run.current_jobs()
    assert all(j.start_time for j in (master, *workers))
    if order == "master-first":
        assert master.start_time < min(w.start_time for w in workers)
    if order == "workers-first":
        assert master.start_time > max(w.start_time for w in workers)


def test_master_done_ends_the_run_and_stops_the_workers(fast_limits, celery_worker):
    fleet = local_project_fleet(size=3)
    conf = """
type: task
name: master-done
nodes: 3
startup_order: workers-first
stop_criteria: master-done
commands:
  - if [ "$DSTACK_NODE_RANK" = 0 ]; then echo master finished; else sleep 313; fi
"""
    with Beat():
        run = submit_run(fleet.project, None, {"configuration": conf})
        run = wait_for_run(run.name, timeout=60)
    assert run.status == "done", job_summary(run)
    assert run.termination_reason == "master_job_done"
    master, *workers = run.current_jobs()
    assert master.termination_reason == "done_by_runner"
    assert all(w.status == "done" and w.termination_reason == "master_done" for w in workers)
    assert runner_processes("sleep 313") == [], "the workers' processes were stopped"
    assert not Instance.objects.filter(status="busy").exists()
