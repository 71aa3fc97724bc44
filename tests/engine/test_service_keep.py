"""process_run's keeper of a service (engine/replicas/keep.py) in the test process, no worker: rows
in, rows out."""

from __future__ import annotations

import pytest

from engine import processing
from runs.models import Job, Run
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db(transaction=True)

THREE = """type: service
name: web
port: 8000
replicas: 3
commands:
  - python3 -m http.server 8000
"""


def test_a_replica_removed_before_it_was_placed_is_left_behind_not_replaced(sent):
    fleet = local_project_fleet(size=1)
    run = submit_run(fleet.project, None, {"configuration": THREE})
    Run.objects.filter(pk=run.pk).update(desired_replicas={"0": 2})
    assert processing.process_run(run.pk)
    removed = Job.objects.get(run=run, job_num=2)
    assert (removed.status, removed.termination_reason) == ("terminated", "terminated_by_server")
    assert removed.drain_at is not None, "the newest not yet serving goes first"
    assert processing.process_run(run.pk)
    removed.refresh_from_db()
    assert removed.superseded
    assert sorted(Job.objects.filter(run=run, superseded=False).values_list("job_num", "submission_num")) == \
        [(0, 0), (1, 0)], "no new submission of a replica the service no longer wants"
    assert Run.objects.get(pk=run.pk).status == "submitted", "not running before a replica runs"
