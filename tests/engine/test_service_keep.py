"""process_run's keeper of a service (engine/replicas/keep.py) in the test process, no worker: rows
in, rows out."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine import processing, sweeps
from engine.replicas import rows as replica_rows
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


def _once(monkeypatch, module, name: str, during):
    """Run `during()` inside the first call of the step body `module.name` (while it holds its row)."""
    original = getattr(module, name)

    def wrapped(held):
        monkeypatch.setattr(module, name, original)
        found = original(held)
        during()
        return found

    monkeypatch.setattr(module, name, wrapped)


def test_an_update_while_process_run_holds_the_service_is_rolled_out_after_all(sent, monkeypatch):
    # the update takes no lease: its nudge bounces off the process_run holding the run, whose copy is
    # of the old deployment; the service's jobs are quiet, so no job change brings the run back
    fleet = local_project_fleet(size=1)
    one = THREE.replace("replicas: 3", "replicas: 1")
    run = submit_run(fleet.project, None, {"configuration": one})
    two = one.replace("replicas: 1", "replicas: 2").replace("http.server 8000", "http.server 8000 --bind 0.0.0.0")
    _once(monkeypatch, processing, "_process",
          lambda: submit_run(fleet.project, None, {"configuration": two, "update": True}))
    sent.clear()
    assert processing.process_run(run.pk)
    assert ("process_run", run.pk, 0, False) in sent.messages, "derived again once the run is free"
    runs = [pk for pk, _, _ in sweeps.runs_to_derive(timezone.now(), timezone.now() + timedelta(seconds=1))]
    assert run.pk in runs, "and the sweep finds it, were that message lost too"
    assert processing.process_run(run.pk)
    run.refresh_from_db()
    assert run.deployment_num == 1 and run.desired_replicas == {"0": 2}
    assert Job.objects.filter(run=run, superseded=False, deployment_num=1).exists(), "the rollout started"
    assert run.pk not in [pk for pk, _, _ in sweeps.runs_to_derive(timezone.now(), run.derived_at)]


def test_only_a_finished_replica_is_superseded(sent):
    # the routes and process_run skip superseded jobs: a live one superseded would serve unseen
    fleet = local_project_fleet(size=1)
    run = submit_run(fleet.project, None, {"configuration": THREE})
    live = Job.objects.filter(run=run, job_num=0).get()
    Job.objects.filter(pk=live.pk).update(status="running")
    live.status = "terminated"  # a stale copy says it ended: the row's status is what counts
    assert not replica_rows.supersede(live) and not Job.objects.get(pk=live.pk).superseded
    Job.objects.filter(pk=live.pk).update(status="terminated")
    assert replica_rows.supersede(live) and Job.objects.get(pk=live.pk).superseded
