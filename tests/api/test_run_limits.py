"""What one project may pile up, through the REST API (runs/limits.py): its runs not
finished and its runs waiting for a host are capped by settings, and retry.duration (how long a run
is retried or waits) by another; a submit past a cap is refused with the setting named, nothing made."""

from __future__ import annotations

import pytest

from engine.submitted import provision
from instances.models import InstanceStatus
from projects.models import Project
from runs.models import Job, Run
from runs.waits import gives_up_at
from tests.api.test_submit_statements import ssh_fleet

pytestmark = pytest.mark.django_db

RUNS = "/api/projects/main/runs/"
PLAIN = "type: task\ncommands: [echo]\n"
WAITING = "type: task\nnodes: 2\ncommands: [echo]\nretry: {on_events: [no-capacity], duration: 1h}\n"


def _submit(api, conf: str, url: str = RUNS):
    return api.post(url, {"configuration": conf}, format="json")


def test_a_submit_past_the_projects_active_runs_cap_is_a_429_naming_the_setting(api, project, settings):
    settings.MUSTER = {**settings.MUSTER, "MAX_ACTIVE_RUNS_PER_PROJECT": 2}
    other = Project.objects.create(name="other")  # another project's runs count against its own cap only
    Run.objects.create(project=other, name="theirs", status="running", configuration={})
    assert [_submit(api, PLAIN).status_code for _ in range(2)] == [201, 201]

    refused = _submit(api, PLAIN)

    assert refused.status_code == 429, refused.content
    [error] = refused.json()["errors"]
    assert "MUSTER_MAX_ACTIVE_RUNS_PER_PROJECT" in error["msg"] and "2 runs not finished" in error["msg"], error
    assert Run.objects.filter(project=project).count() == 2, "nothing made"
    assert _submit(api, PLAIN, "/api/projects/main/runs/plan").status_code == 200, "a plan is not a run"
    Run.objects.filter(project=project).update(status="done")
    assert _submit(api, PLAIN).status_code == 201, "finished runs do not count"


def test_a_run_that_may_wait_past_the_projects_waiting_cap_is_a_429_and_one_that_may_not_is_taken(
        api, project, settings):
    settings.MUSTER = {**settings.MUSTER, "MAX_WAITING_RUNS_PER_PROJECT": 1}
    ssh_fleet(project, 2).instances.update(status=InstanceStatus.BUSY)  # a full fleet
    assert _submit(api, WAITING).status_code == 201
    [master] = Job.objects.filter(job_num=0)
    provision.provision_job(master.pk)  # the engine's step: the fleet is full, the run waits
    master.refresh_from_db()
    assert master.waiting_for == "a free host: fleet hosts is full"

    refused = _submit(api, WAITING)

    assert refused.status_code == 429, refused.content
    [error] = refused.json()["errors"]
    assert error["loc"] == ["retry", "on_events"]
    assert "MUSTER_MAX_WAITING_RUNS_PER_PROJECT" in error["msg"] and "1 runs waiting" in error["msg"], error
    assert Run.objects.count() == 1, "nothing made"
    assert _submit(api, WAITING.replace("no-capacity", "error")).status_code == 201, "it could not wait"


def test_retry_duration_past_the_servers_maximum_is_a_located_400_on_plan_and_submit(api, project, settings):
    settings.MUSTER = {**settings.MUSTER, "MAX_RETRY_DURATION": 7 * 86400}
    long = WAITING.replace("duration: 1h", "duration: 3650d")

    for url in (RUNS, RUNS + "plan"):
        answer = _submit(api, long, url)
        assert answer.status_code == 400, answer.content
        [error] = answer.json()["errors"]
        assert error["loc"] == ["retry", "duration"]
        assert "at most 7d (MUSTER_MAX_RETRY_DURATION)" in error["msg"], error
    assert not Run.objects.exists()
    assert _submit(api, WAITING.replace("duration: 1h", "duration: 7d")).status_code == 201



def test_a_run_stored_with_a_longer_retry_duration_is_held_to_the_cap_when_it_waits(api, project, settings):
    """A run submitted before MUSTER_MAX_RETRY_DURATION was lowered (or before it existed) gives up
    at the cap, not at what its row says (runs.waits, which the engine's wait and the API read)."""
    settings.MUSTER = {**settings.MUSTER, "MAX_RETRY_DURATION": 2 * 3600}
    submitted = _submit(api, WAITING)
    assert submitted.status_code == 201, submitted.content
    run = Run.objects.get(project=project)
    Run.objects.filter(pk=run.pk).update(configuration={**run.configuration, "retry": {
        **run.configuration["retry"], "duration": 3650 * 86400}})
    run.refresh_from_db()

    assert (gives_up_at(run) - run.submitted_at).total_seconds() == 2 * 3600
