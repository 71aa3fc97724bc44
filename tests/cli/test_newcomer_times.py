"""What a newcomer reads of times, restarts and waiting runs (issue 38, findings 1, 4, 5, 6): the
`muster` CLI in its own process against a live server, a real Celery worker and the local
backend's runner agents, and the console's pages as a logged-in browser gets them."""

from __future__ import annotations

import html
import re
from datetime import datetime

import pytest

from console.words import _seconds
from runs.models import Run
from tests.cli import test_cli_live as live
from tests.conftest import client_for
from tests.console.test_pages import _browser, _user
from tests.engine.helpers import wait_for_run
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
    assert _ran_cells(body) == [_seconds(job.end_time - job.start_time)]
