"""What the server keeps of finished jobs' logs: they go with their run and project, after
LOG_RETENTION_DAYS, and within the project's log quota (oldest finished runs first).

Real runs on the local backend with a real worker, driven through the REST API; the files are
looked at where the server keeps them (LOG_DIR).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from instances.services.fleets import create_local_fleet
from runs import log_storage
from runs.models import Job, Run
from runs.services import logs
from tests.engine.helpers import wait_for_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
SECRET = "hunter2-printed-by-the-job"


@pytest.fixture
def local_fleet(fast_limits):
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    fleet = create_local_fleet(project, "local", 2, placement="any")
    yield fleet
    from engine.groups import terminate_fleet_instances

    terminate_fleet_instances(fleet)


def run_printing(api, name: str, command: str, project: str = "main") -> Run:
    conf = f"type: task\nname: {name}\ncommands:\n  - {command}\n"
    resp = api.post(f"/api/projects/{project}/runs/", {"configuration": conf}, format="json")
    assert resp.status_code == 201, resp.json()
    run = wait_for_run(name, timeout=60, project=project)
    assert run.status == "done", run.termination_message
    return run


def log_text(api, name: str) -> str:
    resp = api.get(f"/api/projects/main/runs/{name}/logs?job=0")
    assert resp.status_code == 200, resp.json()
    return resp.json()["text"]


def files_of(run: Run) -> list[Path]:
    return [logs.stored_path(job) for job in Job.objects.filter(run_id=run.pk).select_related("run")]


def kept_text(settings) -> str:
    return "".join(p.read_text(errors="replace") for p in Path(settings.MUSTER["LOG_DIR"]).rglob("*.log"))


def test_deleting_a_run_through_the_api_deletes_its_log_and_what_the_job_printed(local_fleet, celery_worker, api,
                                                                                 settings):
    run = run_printing(api, "leaky", f"echo token={SECRET}")
    [path] = files_of(run)
    assert SECRET in path.read_text()

    assert api.delete("/api/projects/main/runs/leaky/").status_code == 204
    assert not path.exists()
    assert SECRET not in kept_text(settings)


def test_a_new_run_of_the_same_name_takes_the_old_runs_log_away(local_fleet, celery_worker, api, settings):
    old = run_printing(api, "reused", f"echo token={SECRET}")
    [old_path] = files_of(old)
    assert old_path.exists()

    conf = "type: task\nname: reused\ncommands:\n  - sleep 1; echo second run\n"
    assert api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    assert not old_path.exists(), "the replaced run's log stays on the server"
    assert SECRET not in log_text(api, "reused")
    assert wait_for_run("reused", timeout=60).status == "done"
    assert log_text(api, "reused") == "second run\n"
    assert SECRET not in kept_text(settings)


def test_deleting_a_project_deletes_its_logs(fast_limits, celery_worker, api, settings):
    """No API or admin page deletes a project (its events and hosts refuse the admin's cascade):
    an operator does it in `manage.py shell`, and its logs must go with it all the same."""
    from engine.groups import terminate_fleet_instances
    from projects.models import Project

    fleet = create_local_fleet(Project.objects.get(name="main"), "local", 1, placement="any")
    try:
        run = run_printing(api, "doomed", f"echo token={SECRET}")
    finally:
        terminate_fleet_instances(fleet)
    [path] = files_of(run)
    assert path.exists()
    Project.objects.get(name="main").delete()
    assert not path.exists() and not path.parent.exists()
    assert SECRET not in kept_text(settings)


def test_the_retention_sweep_deletes_the_logs_of_runs_finished_longer_ago(local_fleet, celery_worker, api, settings):
    from engine import tasks

    retention = 4.0  # seconds
    settings.MUSTER = {**settings.MUSTER, "LOG_RETENTION_DAYS": retention / 86400}
    old = run_printing(api, "old", "echo old output")
    time.sleep(retention + 0.5)
    new = run_printing(api, "new", "echo new output")
    [old_path], [new_path] = files_of(old), files_of(new)
    assert old_path.exists()

    tasks.sweep_logs.delay()  # what beat sends every LOG_SWEEP_INTERVAL
    wait_until(lambda: not old_path.exists(), timeout=20, what="the old run's log deleted by the sweep")
    assert new_path.exists(), "a run finished within the retention keeps its log"
    assert log_text(api, "old") == "" and log_text(api, "new") == "new output\n"


@pytest.mark.parametrize("where", ["setting", "project"])
def test_a_project_over_its_log_quota_loses_its_oldest_runs_logs_first_then_cuts_the_new_one(
        local_fleet, celery_worker, api, settings, where):
    quota = 5000
    if where == "setting":
        settings.MUSTER = {**settings.MUSTER, "LOG_QUOTA": quota}
    else:  # an operator's quota for this project wins over the default
        local_fleet.project.log_quota = quota
        local_fleet.project.save(update_fields=["log_quota"])
    first = run_printing(api, "first", "printf 'a%.0s' $(seq 2000)")
    second = run_printing(api, "second", "printf 'b%.0s' $(seq 2000)")
    assert log_text(api, "first") == "a" * 2000 and log_text(api, "second") == "b" * 2000

    run_printing(api, "third", "printf 'c%.0s' $(seq 2000)")
    assert log_text(api, "first") == "", "the oldest finished run's log makes room"
    assert not any(p.exists() for p in files_of(first))
    assert log_text(api, "second") == "b" * 2000 and log_text(api, "third") == "c" * 2000

    run_printing(api, "loud", "printf 'd%.0s' $(seq 8000)")
    assert log_text(api, "second") == "" and log_text(api, "third") == ""
    assert not any(p.exists() for p in files_of(second))
    text = log_text(api, "loud")
    assert text == "d" * quota + log_storage.over_quota_note(quota, quota).decode()


def test_the_quota_counts_the_projects_other_copies_only(settings, tmp_path):
    settings.MUSTER = {**settings.MUSTER, "LOG_DIR": str(tmp_path)}
    where = log_storage.project_dir(7)
    assert log_storage._usage(7, where / "own.log") == 0, "a project with no copies yet has no directory"
    where.mkdir()
    for name, size in [("a.log", 10), ("b.log", 20), ("a.times", 5), ("own.log", 7)]:
        (where / name).write_bytes(b"x" * size)
    # the job's own copy is what the budget is for; a copy's stamps (.times) are not held to the quota
    assert log_storage._usage(7, where / "own.log") == 30


def test_a_job_that_printed_nothing_does_not_read_its_projects_copies(local_fleet, celery_worker, api, monkeypatch):
    reads = []
    usage = log_storage._usage
    monkeypatch.setattr(log_storage, "_usage", lambda *a: reads.append(a) or usage(*a))
    run_printing(api, "printing", "echo hello")
    assert len(reads) == 1, "a copy with bytes is held to the quota"
    run_printing(api, "quiet", "sleep 0")
    assert len(reads) == 1, "an empty copy reads no other copy: a directory of every job's log is not walked"
    assert log_text(api, "printing") == "hello\n" and log_text(api, "quiet") == ""


@pytest.fixture
def small_log_disk(tmp_path, settings):
    """LOG_DIR alone on a 1 MiB tmpfs: the hosts' own disks (LOCAL_DIR) keep their space."""
    where = tmp_path / "logdisk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(where)], check=True)
    settings.MUSTER = {**settings.MUSTER, "LOG_DIR": where / "logs"}
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> Path:
    filler = where / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == 28, exc
    return filler


def test_a_job_ending_while_the_log_disk_is_full_ends_says_its_log_was_lost_and_later_logs_are_kept(
        local_fleet, celery_worker, api, small_log_disk):
    filler = fill(small_log_disk)
    during = run_printing(api, "during", "seq 100000")  # about 590 KB: the disk has none of it
    assert not any(p.exists() for p in files_of(during)), "no part of a log passes for all of it"
    events = api.get("/api/projects/main/events/?run=during").json()
    assert any("the log of job 0 was not kept" in e["message"] for e in events), events

    filler.unlink()
    run_printing(api, "after", "seq 100000")
    assert log_text(api, "after") == "".join(f"{i}\n" for i in range(1, 100001)), "the worker keeps logs again"
