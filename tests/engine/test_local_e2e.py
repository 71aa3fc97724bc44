from __future__ import annotations

import pytest

from instances.models import Instance
from instances.services.fleets import create_local_fleet
from runs import log_storage
from runs.services import logs
from runs.services.submission import submit_run
from tests.conftest import example
from tests.engine.helpers import wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def local_fleet(fast_limits):
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    fleet = create_local_fleet(project, "local", 4, placement="cluster")
    yield fleet
    from engine.groups import terminate_fleet_instances

    terminate_fleet_instances(fleet)


def test_the_local_pd_example_runs_to_done_with_the_router_reaching_both_workers(local_fleet, celery_worker):
    run = submit_run(local_fleet.project, None, {"configuration": example("pd-disagg-local.yml")})
    run = wait_for_run(run.name, timeout=90)
    jobs = list(run.current_jobs())
    assert run.status == "done", [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in jobs]
    router_log = logs.read(jobs[0]).decode()
    assert f"router got from prefill at {jobs[1].instance.internal_ip}:8000: prefill worker 1 of 3" in router_log
    assert f"router got from decode at {jobs[2].instance.internal_ip}:8000: decode worker 2 of 3" in router_log
    assert jobs[0].start_time > max(jobs[1].start_time, jobs[2].start_time), "workers-first: router starts last"
    assert not Instance.objects.filter(status="busy").exists()


def test_the_logs_api_serves_a_jobs_output_from_an_offset(local_fleet, celery_worker, api):
    conf = "type: task\nname: chatty\ncommands:\n  - echo first line\n  - echo second line\n"
    assert api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    assert wait_for_run("chatty", timeout=60).status == "done"
    whole = api.get("/api/projects/main/runs/chatty/logs?job=0").json()
    assert whole["text"] == "first line\nsecond line\n"
    rest = api.get(f"/api/projects/main/runs/chatty/logs?job=0&start={len('first line')+1}").json()
    assert rest["text"] == "second line\n" and rest["next"] == whole["next"]
    assert api.get("/api/projects/main/runs/chatty/logs?job=7").status_code == 400


def test_a_log_longer_than_the_copy_limit_is_kept_up_to_it_and_says_so(local_fleet, celery_worker, api, settings):
    settings.MUSTER = {**settings.MUSTER, "LOG_COPY_LIMIT": 3000}
    conf = "type: task\nname: loud\ncommands:\n  - for i in $(seq 2000); do echo line $i; done\n"
    assert api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    assert wait_for_run("loud", timeout=60).status == "done"
    text = api.get("/api/projects/main/runs/loud/logs?job=0").json()["text"]
    assert text.startswith("line 1\nline 2\n")
    assert text.endswith(log_storage.truncated_note(3000).decode())
    assert len(text) == 3000 + len(log_storage.truncated_note(3000))
