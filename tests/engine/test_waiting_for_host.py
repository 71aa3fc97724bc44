"""A run that finds its fleet full waits for a host (engine/submitted/waiting.py), through the REST
API with a real worker and real local runners: it holds no host while it waits, is not resubmitted,
says once what it waits for, and starts when a host is given back."""

from __future__ import annotations

import time

import pytest

from events.models import Event
from instances.models import Instance
from runs.models import Run
from tests.engine.helpers import Beat, local_project_fleet, runner_processes, wait_for_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HOLDER = "type: task\nname: holder\nnodes: 2\ncommands: [sleep 343]\n"
WAITER = "type: task\nname: waiter\nnodes: 2\ncommands: [echo waited]\nretry: {on_events: [no-capacity], duration: %s}\n"


def _submit(api, conf: str, project: str = "main") -> None:
    answer = api.post(f"/api/projects/{project}/runs/", {"configuration": conf}, format="json")
    assert answer.status_code == 201, answer.json()


def _holder_running(api, project: str = "main") -> None:
    _submit(api, HOLDER, project)
    wait_for_run("holder", statuses=("running",), timeout=90, project=project)


def _job0(api, name: str, project: str = "main") -> dict:
    return api.get(f"/api/projects/{project}/runs/{name}/").json()["jobs"][0]


def _says_it_waits(api, project: str = "main") -> None:
    wait_until(lambda: _job0(api, "waiter", project)["status_message"].startswith("waiting for a free host"),
               timeout=30, what=f"the waiter of {project} to say it waits for a host")


def _stop_holder(api, project: str = "main") -> None:
    assert api.post(f"/api/projects/{project}/runs/holder/stop", {}, format="json").status_code in (200, 202)
    wait_for_run("holder", timeout=60, project=project)


def test_a_run_on_a_full_fleet_waits_without_a_host_and_starts_once_one_is_given_back(
        fast_limits, celery_worker, superuser_api):
    local_project_fleet(size=2)
    with Beat():
        _holder_running(superuser_api)
        _submit(superuser_api, WAITER % "10m")
        _says_it_waits(superuser_api)
        job = _job0(superuser_api, "waiter")
        assert job["status_message"] == "waiting for a free host: fleet local is full", job
        time.sleep(3 * fast_limits["WAITING_HOST_RECHECK"])  # a few rechecks while the fleet stays full
        waiter = Run.objects.get(name="waiter")
        assert (waiter.status, waiter.submission_num) == ("submitted", 0), "it waits; it is not torn down and retried"
        assert not waiter.jobs.filter(instance__isnull=False).exists(), "a waiting run holds no host"
        said = Event.objects.filter(run=waiter, message__startswith="waiting for a free host")
        assert said.count() == 1, "the wait is said once, not on every look"
        _stop_holder(superuser_api)
        done = wait_for_run("waiter", timeout=90)
    assert (done.status, done.submission_num) == ("done", 0), [(j.status, j.termination_message)
                                                                for j in done.current_jobs()]
    assert not [j for j in done.current_jobs() if j.waiting_for.startswith("a free host")], "placing ends the wait"
    assert runner_processes("sleep 343") == []
    assert not Instance.objects.filter(status="busy").exists()


def test_a_wait_longer_than_retry_duration_ends_the_run_retry_limit_exceeded(
        fast_limits, celery_worker, superuser_api):
    local_project_fleet(size=2)
    with Beat():
        _holder_running(superuser_api)
        _submit(superuser_api, WAITER % "4s")
        waiter = wait_for_run("waiter", timeout=60)
        _stop_holder(superuser_api)
    assert (waiter.status, waiter.termination_reason) == ("failed", "retry_limit_exceeded")
    assert Event.objects.filter(run=waiter, message__startswith="waiting for a free host").exists()
    assert not Instance.objects.filter(status="busy").exists()


def test_without_retry_a_full_fleet_fails_the_run_at_once(fast_limits, celery_worker, superuser_api):
    local_project_fleet(size=2)
    with Beat():
        _holder_running(superuser_api)
        _submit(superuser_api, "type: task\nname: impatient\nnodes: 2\ncommands: [echo]\n")
        run = wait_for_run("impatient", timeout=60)
        _stop_holder(superuser_api)
    job = run.current_jobs()[0]
    assert (run.status, job.termination_reason) == ("failed", "failed_to_start_due_to_no_capacity")
    assert "0 of them idle" in job.termination_message, job.termination_message
    assert not Event.objects.filter(run=run, message__startswith="waiting for").exists()


def test_a_run_that_could_never_fit_fails_at_once_even_with_retry(fast_limits, celery_worker, superuser_api):
    local_project_fleet(size=2)
    with Beat():
        _submit(superuser_api, "type: task\nname: huge\nnodes: 3\ncommands: [echo]\n"
                               "retry: {on_events: [no-capacity], duration: 10m}\n")
        run = wait_for_run("huge", statuses=("pending", "failed"), timeout=60)
    assert run.status == "pending", "it is retried later as before: no wait for hosts that do not exist"
    assert not Event.objects.filter(run=run, message__startswith="waiting for").exists()


def test_a_lost_wake_is_made_up_for_by_the_sweep_s_recheck(fast_limits, celery_worker, superuser_api, monkeypatch):
    from engine.submitted import waiting

    woken = []  # the release's admission look is never asked for: neither counted nor sent
    monkeypatch.setattr(waiting, "_released", lambda instances, freed: woken.append(sorted(freed)))
    local_project_fleet(size=2)
    with Beat():
        _holder_running(superuser_api)
        _submit(superuser_api, WAITER % "10m")
        _says_it_waits(superuser_api)
        _stop_holder(superuser_api)
        done = wait_for_run("waiter", timeout=90)
    assert woken, "the holder's hosts were given back with a wake, which this test dropped"
    # the recheck that found the hosts idle asked the fleet's look, which placed the waiter
    assert (done.status, done.submission_num) == ("done", 0)


def test_a_host_given_back_in_one_project_wakes_no_waiter_of_another_with_the_same_names(
        fast_limits, celery_worker, superuser_api, django_user_model):
    from instances.services.fleets import create_local_fleet
    from projects.models import Membership, Project

    local_project_fleet(size=2)
    other = Project.objects.create(name="other")
    Membership.objects.create(project=other, user=django_user_model.objects.get(username="root"), role="admin")
    theirs = create_local_fleet(other, "local", 2, placement="cluster")  # the same fleet and run names
    with Beat():
        for project in ("main", "other"):
            _holder_running(superuser_api, project)
            _submit(superuser_api, WAITER % "10m", project)
            _says_it_waits(superuser_api, project)
        _stop_holder(superuser_api, "main")
        mine = wait_for_run("waiter", timeout=90)
        time.sleep(3 * fast_limits["WAITING_HOST_RECHECK"])  # the other waiter's rechecks, its fleet still full
        waiting = Run.objects.get(project=other, name="waiter")
        assert waiting.status == "submitted", "main's free host is not the other project's to take"
        assert not waiting.jobs.filter(instance__isnull=False).exists()
        assert _job0(superuser_api, "waiter", "other")["status_message"] == \
            "waiting for a free host: fleet local is full"
        _stop_holder(superuser_api, "other")
        theirs_done = wait_for_run("waiter", timeout=90, project="other")
    assert (mine.status, theirs_done.status) == ("done", "done")
    assert {i.fleet_id for i in Instance.objects.filter(jobs__run=theirs_done)} == {theirs.pk}
