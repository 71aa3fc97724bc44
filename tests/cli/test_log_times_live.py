"""Each line of a job's log carries the time its runner received it, and every view of all the jobs
of a run shows their lines in that order (issue 38, finding 5): two jobs of a real run on the local
backend, a real Celery worker, the `muster` CLI in its own process, the API, and the console over
HTTP."""

from __future__ import annotations

import re
import time
from datetime import datetime

import pytest
import requests

from runs.models import Run
from tests.cli import test_cli_live as live
from tests.conftest import client_for
from tests.console.test_pages import _user
from tests.dstack_cli.bodies import dstack_client
from tests.engine.helpers import wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

local_fleet, muster, write = live.local_fleet, live.muster, live.write

# job 0 prints A, C, E and job 1 B, D, each a second after the other job's line before it
TAKING_TURNS = """type: task
name: turns
nodes: 2
commands:
  - |
    D={sync}
    w() {{ while [ ! -e "$D/$1" ]; do sleep 0.1; done; sleep 1; }}
    if [ "$DSTACK_NODE_RANK" = 0 ]; then
      echo line-A; touch "$D/a"; w b; echo line-C; touch "$D/c"; w d; echo line-E
    else
      w a; echo line-B; touch "$D/b"; w c; echo line-D; touch "$D/d"
    fi
"""
IN_TURN = ["line-A", "line-B", "line-C", "line-D", "line-E"]
OF_JOB = {"line-A": 0, "line-B": 1, "line-C": 0, "line-D": 1, "line-E": 0}


def _expand(runs):
    return [ms for ms, count in runs for _ in range(count)]


def _run_turns(muster, tmp_path) -> Run:
    sync = tmp_path / "sync"
    sync.mkdir()
    started = muster("apply", "-f", write(tmp_path, TAKING_TURNS.format(sync=sync)), "-y", "-d")
    assert started.returncode == 0, started.stderr
    run = wait_for_run("turns", timeout=120)
    assert run.status == "done", (run.status, run.termination_message)
    return run


def _login(base: str, user) -> requests.Session:
    browser = requests.Session()
    browser.get(f"{base}/login/", timeout=30)
    answer = browser.post(f"{base}/login/", timeout=30, allow_redirects=False, headers={"Referer": f"{base}/login/"},
                          data={"username": user.username, "password": f"pw-{user.username}-long-enough",
                                "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
    assert answer.status_code == 302, answer.text[:500]
    return browser


def test_the_lines_of_all_jobs_are_shown_in_the_order_they_were_written(
        make_user, muster, local_fleet, celery_worker, live_server, tmp_path):
    bob = _user(make_user, "bob")
    before = int(time.time() * 1000)
    run = _run_turns(muster, tmp_path)
    after = int(time.time() * 1000)
    labels = {j.job_num: f"[{j.node_group_name}/{j.node_group_rank}]" for j in run.current_jobs()}

    # the CLI: every job's lines, in time order rather than job after job
    shown = muster("logs", "turns")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [f"{labels[OF_JOB[line]]} {line}" for line in IN_TURN], shown.stdout
    # one job asked for by number: its log as written, to pipe like a file
    assert muster("logs", "turns", "--job", "0").stdout == "line-A\nline-C\nline-E\n"

    # the API: each line's time, by the host's clock as its runner received the line
    api = client_for(bob)
    stamps = {}
    for num in (0, 1):
        answer = api.get(f"/api/projects/main/runs/turns/logs?job={num}").json()
        lines = answer["text"].splitlines()
        times = _expand(answer["times"])
        assert len(times) == len(lines), answer
        stamps.update(zip(lines, times, strict=True))
    ordered = [stamps[line] for line in IN_TURN]
    assert before <= ordered[0] and ordered[-1] <= after, ordered
    # each line came at least a second (the job's sleep) after the other job's line before it
    assert all(later - earlier >= 900 for earlier, later in zip(ordered, ordered[1:], strict=False)), ordered

    # the console over HTTP: the all-jobs text in time order, and the times its log view shows
    browser = _login(live_server.url, bob)
    text = browser.get(f"{live_server.url}/projects/main/runs/turns/log.txt", timeout=30)
    assert text.status_code == 200
    assert text.text.splitlines() == [f"{labels[OF_JOB[line]]} {line}" for line in IN_TURN], text.text
    view = browser.get(f"{live_server.url}/projects/main/runs/turns/log?job=1&start=0", timeout=30).json()
    assert _expand(view["times"]) == [stamps["line-B"], stamps["line-D"]]

    # the /dstack API's log events, in dstack's shape, carry the same times
    job = run.current_jobs().get(job_num=1)
    events = dstack_client(bob).post("/dstack/api/project/main/logs/poll", format="json", data={
        "run_name": "turns", "job_submission_id": str(job.uuid)}).json()["logs"]
    assert [datetime.fromisoformat(e["timestamp"]).timestamp() * 1000 for e in events] == pytest.approx(
        [stamps["line-B"], stamps["line-D"]], abs=1)


# A job may write its own job directory: it puts garbage, far-future and out-of-order stamps in its
# output.times, and a torn record, between its lines.
TAMPERING = r"""type: task
name: tamper
commands:
  - echo first
  - sleep 0.5
  - >-
    python3 -c "import os, struct, time; t = '../output.times'; f = open(t, 'r+b' if os.path.exists(t) else 'wb');
    f.write(struct.pack('>QQ', 999999, int(time.time() * 1000) + 10**12) + struct.pack('>QQ', 0, 2**63 - 1)
    + struct.pack('>QQ', 6, 0) + bytes(range(7)))"
  - sleep 0.5
  - echo second
  - sleep 0.5
  - echo third
"""


def test_a_job_that_garbles_its_stamps_still_has_its_whole_log_in_order_and_no_time_ahead(
        make_user, muster, local_fleet, celery_worker, tmp_path):
    bob = _user(make_user, "bob")
    before = int(time.time() * 1000)
    assert muster("apply", "-f", write(tmp_path, TAMPERING), "-y", "-d").returncode == 0
    run = wait_for_run("tamper", timeout=120)
    assert run.status == "done", (run.status, run.termination_message)
    read_at = int(time.time() * 1000)

    answer = client_for(bob).get("/api/projects/main/runs/tamper/logs?job=0").json()
    assert answer["text"] == "first\nsecond\nthird\n"
    times = _expand(answer["times"])
    assert len(times) == 3 and times == sorted(times), times
    assert all(before <= ms <= read_at for ms in times), times  # none before the job, none ahead
    shown = muster("logs", "tamper")
    assert shown.returncode == 0, shown.stderr
    assert [re.sub(r"^\[\S+\] ", "", line) for line in shown.stdout.splitlines()] == ["first", "second", "third"]
