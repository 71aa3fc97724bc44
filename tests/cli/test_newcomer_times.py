"""What a newcomer reads of times, restarts and waiting runs (issue 38, findings 1, 4, 5, 6): the
`muster` CLI in its own process against a live server, a real Celery worker and the local
backend's runner agents, and the console's pages as a logged-in browser gets them."""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta

import pytest

from console.words import seconds
from runs.models import Run
from tests.cli import test_cli_live as live
from tests.conftest import client_for
from tests.console.test_pages import _browser, _user
from tests.engine.helpers import Beat, wait_for_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# the live CLI's fixtures: the local fleet, and `muster` (the CLI as alice, against the live server)
local_fleet, muster, write = live.local_fleet, live.muster, live.write

SLEEPER = "type: task\nname: sleeper\ncommands: [echo up, sleep 300]\n"


def _ran_cells(body: str) -> list[str]:
    return [html.unescape(c) for c in re.findall(r'<td class="ran">(.*?)</td>', body)]


def test_a_stopped_job_has_an_end_time_the_api_writes_as_iso_and_its_run_time_stops(
        make_user, muster, local_fleet, celery_worker, tmp_path):
    alice = _user(make_user, "bob")
    assert muster("apply", "-f", write(tmp_path, SLEEPER), "-y", "-d").returncode == 0
    run = Run.objects.get(name="sleeper")
    wait_until(lambda: run.current_jobs().filter(start_time__isnull=False).exists(), 60, "the job to run")
    stopped = muster("stop", "sleeper", "-y")
    assert stopped.returncode == 0, stopped.stderr
    assert wait_for_run("sleeper").status == "terminated"

    job = run.current_jobs().get()
    assert job.status == "terminated"
    assert job.end_time is not None and job.end_time >= job.start_time, "a stopped job ends too"

    answer = client_for(alice).get("/api/projects/main/runs/sleeper/").json()
    one = answer["jobs"][0]
    # one format for every time of the API: ISO 8601 strings, as submitted_at
    for key in ("start_time", "end_time"):
        assert isinstance(one[key], str), (key, one[key])
        assert datetime.fromisoformat(one[key]).timestamp() == pytest.approx(getattr(job, key), abs=1e-3)
    assert one["end_time"][-1] == answer["submitted_at"][-1]  # the same zone suffix

    # the console shows the run time to the job's end, not to now
    body = _browser(alice).get("/projects/main/runs/sleeper/").content.decode()
    assert _ran_cells(body) == [seconds(job.end_time - job.start_time)]


TOO_BIG = "type: task\nname: toobig\nnodes: 8\ncommands: [echo hi]\n"
HOLDER = "type: task\nname: holder\nnodes: 4\ncommands: [sleep 300]\n"
PATIENT = ("type: task\nname: patient\nretry:\n  on_events: [no-capacity]\n  duration: 2h\n"
           "commands: [echo finally]\n")


def test_a_run_that_cannot_fit_says_the_fix_in_real_figures(muster, local_fleet, celery_worker, tmp_path):
    result = muster("apply", "-f", write(tmp_path, TOO_BIG), "-y")
    said = result.stdout + result.stderr
    assert result.returncode == 1, said
    assert "fleet local has 4 hosts: lower nodes to 4 or add 4 hosts to fleet local" in said, said
    assert "the group needs 8" not in said  # the number once, in "needs 8 hosts"
    run = wait_for_run("toobig")
    # every job of a run that never started ends too (the batched end of its unstarted jobs)
    assert all(j.end_time is not None for j in run.current_jobs()), "an unstarted job ends when its run fails"


def test_a_run_waiting_for_a_host_reads_waiting_with_the_time_it_gives_up(
        make_user, muster, local_fleet, celery_worker, tmp_path):
    bob = _user(make_user, "bob")
    assert muster("apply", "-f", write(tmp_path, HOLDER), "-y", "-d").returncode == 0
    wait_for_run("holder", statuses=("running",))
    assert muster("apply", "-f", write(tmp_path, PATIENT), "-y", "-d").returncode == 0
    patient = Run.objects.get(name="patient")
    wait_until(lambda: patient.current_jobs().filter(waiting_for__startswith="a free host").exists(), 60,
               "the run to wait for a host")
    until = patient.submitted_at + timedelta(hours=2)
    shown = until.strftime("%Y-%m-%d %H:%M")

    answer = client_for(bob).get("/api/projects/main/runs/patient/").json()
    assert answer["status"] == "submitted" and answer["waiting_for"].startswith("a free host"), answer
    assert datetime.fromisoformat(answer["gives_up_at"]) == until

    ps = muster("ps")
    assert ps.returncode == 0, ps.stderr
    row = next(line for line in ps.stdout.splitlines() if line.startswith("patient "))
    assert row.split()[1] == "waiting", row
    assert f"gives up at {shown} UTC" in row, row

    body = _browser(bob).get("/").content.decode()
    cell = re.search(r'<tr data-run="patient">.*?</tr>', body, re.S).group(0)
    assert ">waiting</span>" in cell and "gives up at" in cell and f"{shown} UTC" in cell, cell
    assert muster("stop", "holder", "-y", "--abort").returncode == 0
    assert muster("stop", "patient", "-y", "--abort").returncode == 0
    wait_for_run("patient")


RESTARTER = """\
type: task
name: restarter
groups:
  - name: head
    commands:
      - for _ in $(seq 600); do [ -e {tmp}/second ] && break; sleep 0.2; done
      - echo head done
  - name: worker
    on_failure: restart-group
    commands:
      - if [ ! -e {tmp}/failed-once ]; then touch {tmp}/failed-once; echo "attempt one dies"; exit 1; fi
      - touch {tmp}/second
      - echo second attempt
"""


def test_a_group_restart_is_said_counted_and_its_failed_attempts_log_stays_readable(
        make_user, muster, local_fleet, celery_worker, settings, tmp_path):
    settings.MUSTER = {**settings.MUSTER, "RETRY_BACKOFF": [3]}  # the back-off `apply` announces
    bob = _user(make_user, "bob")
    with Beat():  # the sweep starts a restart once its back-off is over
        applied = muster("apply", "-f", write(tmp_path, RESTARTER.replace("{tmp}", str(tmp_path))), "-y")
    assert applied.returncode == 0, applied.stderr
    said = applied.stderr
    assert "group worker restarting (attempt 2 of 4) in 3 s: job 1 (worker/0) exited 1" in said, said
    assert "run restarter: group worker restarted (submission 1); the failed attempt's log: " \
           "muster logs restarter --submission 0" in said, said
    assert "resubmitted" not in said

    ps = muster("ps", "-v", "-a")
    header, *rows = ps.stdout.splitlines()
    assert header.split()[7] == "RESTARTS", header
    restarts = {r.split()[2]: r.split()[7] for r in rows if r.startswith("restarter ")}
    assert restarts == {"head": "0", "worker": "1"}, ps.stdout

    earlier = muster("logs", "restarter", "--submission", "0", "--job", "1")
    assert earlier.returncode == 0, earlier.stderr
    assert earlier.stdout == "attempt one dies\n"
    current = muster("logs", "restarter", "--job", "1")
    assert current.stdout == "second attempt\n"

    answer = client_for(bob).get("/api/projects/main/runs/restarter/").json()
    assert [(j["job_num"], j["submission_num"], j["status"]) for j in answer["earlier_jobs"]] == [(1, 0, "failed")]
    assert [(r["group"], r["restarts"], r["max_restarts"], r["upcoming"]) for r in answer["restarts"]] == [
        ("worker", 1, 3, False)]

    browser = _browser(bob)
    body = browser.get("/projects/main/runs/restarter/").content.decode()
    said = html.unescape(re.sub(r"<[^>]+>", "", re.search(r'<ul class="restarts".*?</ul>', body, re.S).group(0)))
    assert "group worker: restarted 1 of 3 times; last for: job 1 (worker/0) exited 1" in " ".join(said.split())
    assert re.findall(r'<td class="restarts">(\d+)</td>', body) == ["0", "1"]
    link = html.unescape(re.search(r'<a class="earlier-log" href="([^"]+)"', body).group(1))
    log = browser.get(link)
    assert log.status_code == 200 and log["Content-Disposition"].startswith("inline")
    assert b"".join(log.streaming_content) == b"attempt one dies\n"
