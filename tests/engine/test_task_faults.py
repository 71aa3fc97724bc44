"""Every task survives a duplicated message and a lost one (the sweep re-enqueues it)."""

from __future__ import annotations

import pytest

from instances.models import Instance
from runs.services import logs
from runs.services.submission import submit_run
from tests.engine.faults import inject
from tests.engine.helpers import Beat, job_summary, local_project_fleet, wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The workers start first, so job 0's first look finds job 1 not yet running and is sent again
# on its own (an advance_job: the two first looks go together, as advance_jobs, tests/engine/
# test_batch_faults.py); rank 1 runs 6 s longer, so the two ends are seen apart even when the
# master starts late on a loaded machine, each a finish_job (seen together they go as finish_jobs).
TWO_NODES = """
type: task
name: {name}
nodes: 2
startup_order: workers-first
commands:
  - echo "started rank $DSTACK_NODE_RANK"
  - sleep $(( 1 + 6 * DSTACK_NODE_RANK ))
"""
TASKS = ["provision_job", "advance_job", "finish_job", "process_run"]


@pytest.mark.parametrize("mode", ["twice", "drop"])
@pytest.mark.parametrize("task_name", TASKS)
def test_a_run_finishes_correctly_when_a_task_message_is_duplicated_or_lost(
        task_name, mode, fast_limits, celery_worker, monkeypatch):
    fleet = local_project_fleet(size=2)
    faulty = inject(monkeypatch, task_name, mode)
    name = f"fault-{task_name.replace('_', '-')}-{mode}"
    with Beat(interval=0.3):
        run = submit_run(fleet.project, None, {"configuration": TWO_NODES.format(name=name)})
        run = wait_for_run(run.name, timeout=60)
    assert run.status == "done", job_summary(run)
    assert faulty.injected >= 1, "the fault was injected"
    for job in run.current_jobs():
        assert logs.read(job).decode().count("started rank") == 1, "each job's commands ran exactly once"
    instances = [j.instance_id for j in run.current_jobs()]
    assert len(set(instances)) == 2, "two jobs never share an instance"
    assert not Instance.objects.filter(status="busy").exists()


def test_running_jobs_are_watched_when_every_watch_tick_is_dropped_in_a_backlog(
        fast_limits, celery_worker, monkeypatch):
    # Beat's watch ticks carry an expiry so that they never pile up; a worker behind by more than
    # that drops every one of them. Here every tick expires unseen: the sweep must still see the
    # running jobs overdue and send the watch itself.
    from engine import tasks

    real, dropped = tasks.watch_running.apply_async, []

    def expiring(*args, **kwargs):
        if "expires" in kwargs:  # a beat tick (the fixture's, as muster/celery.py's beat schedule)
            dropped.append(kwargs["expires"])
            return None
        return real(*args, **kwargs)

    monkeypatch.setattr(tasks.watch_running, "apply_async", expiring)
    fleet = local_project_fleet(size=2)
    with Beat(interval=0.3):
        run = submit_run(fleet.project, None, {"configuration": TWO_NODES.format(name="ticks-dropped")})
        run = wait_for_run(run.name, timeout=60)
    assert run.status == "done", job_summary(run)
    assert dropped, "the ticks were sent, and dropped"
    assert not Instance.objects.filter(status="busy").exists()
