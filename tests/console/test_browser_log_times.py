"""The console's all-jobs log view in Chromium shows the lines of every job in the order they were
written, each with the time its runner received it (issue 38, finding 5)."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from tests.cli.test_log_times_live import IN_TURN, OF_JOB, TAKING_TURNS
from tests.console.browser import needs_chromium
from tests.console.test_browser import PASSWORD, browser, operator  # noqa: F401 - fixtures
from tests.engine.helpers import wait_for_run
from tests.waiting import wait_until

pytestmark = [needs_chromium, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_every_jobs_lines_are_shown_in_the_order_they_were_written_with_their_times(
        operator, celery_worker, live_server, browser, tmp_path):  # noqa: F811
    user, api = operator
    sync = tmp_path / "sync"
    sync.mkdir()
    resp = api.post("/api/projects/main/runs/", {"configuration": TAKING_TURNS.format(sync=sync)}, format="json")
    assert resp.status_code == 201, resp.content
    run = wait_for_run("turns", timeout=120)
    assert run.status == "done", (run.status, run.termination_message)
    labels = {j.job_num: f"[{j.node_group_name}/{j.node_group_rank}]" for j in run.current_jobs()}
    stamps = {}
    for num in (0, 1):
        answer = api.get(f"/api/projects/main/runs/turns/logs?job={num}").json()
        times = [ms for ms, count in answer["times"] for _ in range(count)]
        stamps.update(zip(answer["text"].splitlines(), times, strict=True))

    browser.get(live_server.url + "/login/")
    browser.find_element("id", "id_username").send_keys(user.username)
    browser.find_element("id", "id_password").send_keys(PASSWORD)
    browser.find_element("css selector", "form.login button").click()
    wait_until(lambda: "turns" in browser.page_source, 30, "the runs list after log in")
    browser.get(live_server.url + "/projects/main/runs/turns/")

    def shown() -> list[str]:
        return [line for line in browser.find_element("id", "log-text").text.splitlines() if "line-" in line]

    wait_until(lambda: len(shown()) == len(IN_TURN), 30, "every job's lines")
    # the time shown is the line's own, in the browser's zone (here the machine's, as Python's)
    clock = browser.execute_script("return Intl.DateTimeFormat().resolvedOptions().timeZone")
    expected = []
    for line in IN_TURN:
        at = datetime.fromtimestamp(stamps[line] / 1000).strftime("%H:%M:%S") if clock in ("UTC", "Etc/UTC") \
            else r"\d\d:\d\d:\d\d"
        expected.append(rf"{re.escape(labels[OF_JOB[line]])} {at} {line}")
    assert all(re.fullmatch(pattern, line) for pattern, line in zip(expected, shown(), strict=True)), shown()
