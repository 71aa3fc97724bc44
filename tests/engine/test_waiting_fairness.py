"""Runs waiting for a host, across projects: the sweep's recheck takes turns across projects
(engine/submitted/waiting.py due_rechecks), so a project with more waiting runs than the sweep's
batch does not keep another project's waiting run from ever being looked at; and a project's waiting
runs are capped (MUSTER_MAX_WAITING_RUNS_PER_PROJECT) in the engine too, for runs submitted before any
waited. Runs submitted through the submission service, the real sweep and provision step, their
messages recorded (tests/engine/conftest.py `sent`)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine import sweeps
from engine.submitted import provision, waiting
from instances.models import InstanceStatus
from projects.models import Project
from runs.choices import JobReason
from runs.models import Job
from runs.services.submission import submit_run
from tests.api.test_submit_statements import ssh_fleet

pytestmark = pytest.mark.django_db(transaction=True)

WAITER = "type: task\nnodes: 2\ncommands: [echo waited]\nretry: {on_events: [no-capacity], duration: 1h}\n"
BATCH = 20


def _waiting_runs(project: Project, count: int, due_since: float) -> list[int]:
    """`count` runs whose job 0 waits for a host and whose recheck has been due for `due_since` s and more."""
    pks = []
    for i in range(count):
        run = submit_run(project, None, {"configuration": WAITER})
        master = run.jobs.get(job_num=0)
        long_ago = timezone.now() - timedelta(seconds=due_since + i)
        Job.objects.filter(pk=master.pk).update(waiting_for=f"{waiting.PREFIX}: fleet f is full",
                                                next_check_at=long_ago, status_changed_at=long_ago)
        pks.append(master.pk)
    return pks


def test_a_project_with_more_waiting_runs_than_the_batch_does_not_starve_another_projects_waiting_run(
        fast_limits, sent, monkeypatch):
    monkeypatch.setattr(sweeps, "BATCH", BATCH)  # the batch of the sweep (engine/tuning.py SWEEP_BATCH), smaller
    crowded = _waiting_runs(Project.objects.create(name="crowded"), 3 * BATCH, due_since=600)
    quiet = _waiting_runs(Project.objects.create(name="quiet"), 2, due_since=60)  # due later than all of those
    sent.clear()

    found = sweeps.sweep()

    (rechecked,) = [pks for name, pks in sent.names() if name == "recheck_jobs"]  # one message for the batch
    assert found["waiting_rechecks"] == BATCH == len(rechecked), "the batch stays bounded"
    assert set(quiet) <= set(rechecked), "the quiet project's waiting runs are looked at in this sweep"
    assert rechecked[:2] == [crowded[-1], quiet[-1]], "each project's longest-due run first, taking turns"
    assert set(rechecked) - set(quiet) == set(crowded[-(BATCH - 2):]), "the crowded project's longest-due go next"


def test_a_run_past_the_projects_waiting_cap_does_not_wait_and_fails_its_attempt_naming_the_setting(
        fast_limits, sent, settings):
    settings.MUSTER = {**settings.MUSTER, "MAX_WAITING_RUNS_PER_PROJECT": 1}
    project = Project.objects.create(name="capped")
    ssh_fleet(project, 2).instances.update(status=InstanceStatus.BUSY)  # a full fleet
    first, second = (submit_run(project, None, {"configuration": WAITER}).jobs.get(job_num=0) for _ in range(2))

    for job in (first, second, first):  # the first looks again: already waiting, it keeps its place
        provision.provision_job(job.pk)

    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, first.waiting_for) == ("submitted", "a free host: fleet hosts is full")
    assert second.status in ("terminating", "failed"), second.status
    assert second.termination_reason == JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY
    assert second.termination_message == (
        "fleet hosts is full, and project capped has 1 runs waiting for a free host already, the most this "
        "server allows (MUSTER_MAX_WAITING_RUNS_PER_PROJECT)"), second.termination_message
