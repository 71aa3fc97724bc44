"""What one look at a probed job's runner makes of its probe results (engine/running/readiness.py),
on a fake runner status: no worker, no runner."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from engine import claims
from engine.job_outcome import job_outcome
from engine.replicas import rows as replica_rows
from engine.running import observe, readiness
from events.models import Event
from instances.models import Instance
from muster.claimable import Lease
from runs.models import Job
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db

PROBED = """type: task
name: probed
probes: [{type: exec, command: [test, -f, loaded], interval: 1s, timeout: 1s}]
ready_timeout: 60s
commands: [sleep 1]
"""


def _running_job() -> Job:
    fleet = local_project_fleet(size=1, name="probed-fleet")
    run = submit_run(fleet.project, None, {"configuration": PROBED})
    host = fleet.instances.get()
    Instance.objects.filter(pk=host.pk).update(status="busy")
    job = run.current_jobs().get()
    Job.objects.filter(pk=job.pk).update(status="running", instance=host, runner_submitted=True,
                                         status_changed_at=timezone.now())
    return Job.objects.select_related("run", "instance").get(pk=job.pk)


def _look(job: Job, state: str, streak: int, started_ago: float) -> None:
    """One look as the watch step takes it: the job held, what it learned written with its give-back."""
    now = time.time()

    def body(held):
        observe.watch_observed(job, {"agent_alive": True, "now": now, "jobs": {job.runner_job_id: {
            "state": state, "start_time": now - started_ago, "end_time": now if state != "running" else None,
            "exit_status": 0 if state != "running" else None,
            "probes": [{"success_streak": streak, "calls": 3, "last_at": now,
                        "last_error": None if streak else "exit 1"}],
        }}}, lease=held.lease)
        return job_outcome(job)

    assert claims.claimed(Job, job.pk, "look", body).applied == {job.pk}


def test_a_job_whose_probes_passed_and_that_ended_between_two_looks_was_ready():
    job = _running_job()
    _look(job, "done", streak=1, started_ago=5)
    job.refresh_from_db()
    assert job.ready_at is not None, "its last results say it was ready: a group waiting on it may start"
    assert (job.status, job.termination_reason) == ("terminating", "done_by_runner")


def test_a_ready_job_keeps_the_probe_results_it_was_ready_with_when_its_stop_failed_them_last():
    job = _running_job()
    _look(job, "running", streak=2, started_ago=5)
    job.refresh_from_db()
    ready_at, shown = job.ready_at, job.probes
    assert ready_at is not None and shown[0]["success_streak"] == 2
    _look(job, "terminated", streak=0, started_ago=6)
    job.refresh_from_db()
    assert (job.ready_at, job.probes) == (ready_at, shown)


def test_a_job_that_ended_unready_past_its_ready_timeout_ends_as_it_ended_not_as_unready():
    job = _running_job()
    _look(job, "done", streak=0, started_ago=120)
    job.refresh_from_db()
    assert job.ready_at is None
    assert (job.status, job.termination_reason) == ("terminating", "done_by_runner")


def test_a_running_job_unready_past_its_ready_timeout_fails_as_unready():
    job = _running_job()
    _look(job, "running", streak=0, started_ago=120)
    job.refresh_from_db()
    assert (job.status, job.termination_reason) == ("terminating", "waiting_ready_limit_exceeded")


PROBED_SERVICE = """type: service
name: probed-web
port: 8000
probes: [{type: http, url: /, interval: 1s, timeout: 1s}]
commands: [python3 -m http.server 8000]
"""


def test_a_replica_drained_while_the_watcher_holds_it_does_not_come_back_into_the_pool(sent):
    # drain is process_run's and takes no job lease: the watcher's copy, read before it, shows no drain_at
    fleet = local_project_fleet(size=1, name="probed-fleet")
    run = submit_run(fleet.project, None, {"configuration": PROBED_SERVICE})
    host = fleet.instances.get()
    Job.objects.filter(run=run).update(status="running", instance=host, runner_submitted=True,
                                       status_changed_at=timezone.now())
    stale = Job.objects.select_related("run", "instance").get(run=run)
    token = claims.claim(Job, stale.pk)
    assert replica_rows.drain(Job.objects.select_related("run").get(pk=stale.pk), "scaled down")
    now = time.time()
    readiness.observe_probes(stale, {"now": now, "start_time": now - 5, "probes": [
        {"success_streak": 5, "calls": 5, "last_at": now, "last_error": None}]}, now, lease=Lease(token))
    drained = Job.objects.get(pk=stale.pk)
    assert drained.drain_at is not None and drained.ready_at is None, "a drained replica stays out of the pool"
    assert not Event.objects.filter(job=drained, message__startswith="ready").exists()
    claims.forget_all()
