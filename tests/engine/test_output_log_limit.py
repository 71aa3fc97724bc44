"""A job's output.log on its host is capped (MUSTER_JOB_LOG_LIMIT): past it the runner keeps a line
that says so and the job goes on. A local job's log lies in the server's data dir, where a job
printing without end filled the disk that the server itself writes to.

Real runs on the local backend with a real worker, driven through the REST API.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.engine.helpers import wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
LIMIT = 100_000
CUT = f"[muster: this job's output reached its log limit ({LIMIT} bytes, MUSTER_JOB_LOG_LIMIT): the rest is not kept; the job goes on]\n"


def local_fleet():
    from instances.services.fleets import create_local_fleet
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    return create_local_fleet(project, "local", 1, placement="any")


def run_to_end(api, name: str, command: str):
    conf = f"type: task\nname: {name}\ncommands:\n  - {command}\n"
    resp = api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
    assert resp.status_code == 201, resp.json()
    return wait_for_run(name, timeout=120)


def whole_log(api, name: str) -> str:
    text, start = "", 0
    while True:
        page = api.get(f"/api/projects/main/runs/{name}/logs?job=0&start={start}").json()
        if not page["text"]:
            return text
        text, start = text + page["text"], page["next"]


@pytest.fixture
def limited(fast_limits, settings):
    settings.MUSTER = {**settings.MUSTER, "JOB_LOG_LIMIT": LIMIT}


def test_a_job_printing_past_the_limit_keeps_the_limit_and_a_line_saying_so_and_goes_on(
        limited, celery_worker, api, tmp_path):
    from engine.groups import terminate_fleet_instances

    fleet = local_fleet()
    try:
        after = tmp_path / "after"
        run = run_to_end(api, "chatty", f"seq 200000; echo printed after the cut; touch {after}")
        assert run.status == "done", run.termination_message
        assert after.exists(), "the job went on past the limit"
        text = whole_log(api, "chatty")
        assert text.startswith("1\n2\n3\n") and text.endswith(CUT), text[-300:]
        assert len(text.encode()) <= LIMIT and "printed after the cut" not in text
    finally:
        terminate_fleet_instances(fleet)


@pytest.fixture
def small_local_dir(tmp_path, settings):
    local = tmp_path / "small-local"
    local.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(local)], check=True)
    settings.MUSTER = {**settings.MUSTER, "LOCAL_DIR": local}
    yield local
    subprocess.run(["umount", "-l", str(local)], check=False)


def test_a_job_printing_more_than_the_local_disk_holds_ends_done_with_its_log_capped(
        limited, small_local_dir, celery_worker, api):
    """64 MB printed where 16 MB fit: the job's own writes failed with ENOSPC once, and it failed."""
    from engine.groups import terminate_fleet_instances

    fleet = local_fleet()
    try:
        run = run_to_end(api, "flood", "yes 0123456789abcdef | head -c 64000000")
        assert run.status == "done", run.termination_message
        assert whole_log(api, "flood").endswith(CUT)
    finally:
        terminate_fleet_instances(fleet)
