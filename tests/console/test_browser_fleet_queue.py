"""The fleets page in Chromium shows each fleet's queue (runs/queue.py) and what each project holds
of it (instances/rows.usage_by_project), with a real worker and real local runners: the caller's
waiting runs in their places, never another project's, though that project's fleet has the same
name and its run waits too (issue 43, item 6)."""

from __future__ import annotations

import pytest

from tests.console.browser import needs_chromium, screenshot_dir
from tests.console.test_browser import _log_in, browser, operator  # noqa: F401 - fixtures
from tests.engine.helpers import Beat, wait_for_run
from tests.waiting import wait_until

pytestmark = [needs_chromium, pytest.mark.django_db(transaction=True), pytest.mark.slow]

HOLDER = "type: task\nname: holder\nnodes: {nodes}\ncommands: ['while [ ! -e {go} ]; do sleep 0.2; done']\n"
WAITER = ("type: task\nname: {name}\nnodes: {nodes}\npriority: {priority}\ncommands: [echo placed]\n"
          "retry: {{on_events: [no-capacity], duration: 10m}}\n")


def _submit(api, project: str, conf: str) -> None:
    answer = api.post(f"/api/projects/{project}/runs/", {"configuration": conf}, format="json")
    assert answer.status_code == 201, answer.content


def _waits(api, project: str, name: str) -> None:
    wait_until(lambda: api.get(f"/api/projects/{project}/runs/{name}/").json()["waiting_for"]
               .startswith("a free host"), 60, f"{project}'s {name} to wait for a host")


def _rows(driver, kind: str) -> list[list[str]]:
    section = driver.find_element("css selector", 'section[aria-label="fleet local4"]')
    return [[cell.text for cell in row.find_elements("tag name", "td")]
            for row in section.find_elements("css selector", f"table.{kind} tbody tr")]


def test_the_fleets_page_shows_the_callers_waiting_runs_in_their_places_and_never_another_projects(
        operator, celery_worker, live_server, browser, tmp_path):  # noqa: F811
    from instances.services.fleets import create_local_fleet
    from projects.models import Membership, Project

    user, api = operator
    other = Project.objects.create(name="other")
    Membership.objects.create(project=other, user=user, role="admin")
    create_local_fleet(other, "local4", 2, placement="cluster")  # the same fleet name as main's
    go = tmp_path / "go"
    try:
        with Beat():
            for project, nodes in (("main", 4), ("other", 2)):
                _submit(api, project, HOLDER.format(nodes=nodes, go=go))
                wait_for_run("holder", statuses=("running",), timeout=120, project=project)
            _submit(api, "other", WAITER.format(name="secret-other", nodes=1, priority=100))
            _waits(api, "other", "secret-other")
            _submit(api, "main", WAITER.format(name="low", nodes=2, priority=10))
            _waits(api, "main", "low")
            _submit(api, "main", WAITER.format(name="urgent", nodes=1, priority=90))
            _waits(api, "main", "urgent")

            _log_in(browser, live_server, user)
            browser.get(f"{live_server.url}/projects/main/fleets/")
            queue = _rows(browser, "queue")
            assert [row[:4] for row in queue] == [["1", "urgent", "0", "90"], ["2", "low", "0", "10"]], queue
            assert all(row[5] == "fleet local4 is full" for row in queue), queue
            assert all(row[4].endswith("s") for row in queue), queue  # how long each has waited
            assert _rows(browser, "usage") == [["main", "4 of 4", "0"]]
            assert "secret-other" not in browser.page_source
            browser.save_screenshot(str(screenshot_dir() / "console-fleet-queue.png"))

            # the other project's page: its own run, none of main's
            browser.get(f"{live_server.url}/projects/other/fleets/")
            assert [row[:4] for row in _rows(browser, "queue")] == [["1", "secret-other", "0", "100"]]
            assert _rows(browser, "usage") == [["other", "2 of 2", "0"]]
            assert "urgent" not in browser.page_source and ">low<" not in browser.page_source

            go.touch()
            for project, name in (("main", "urgent"), ("main", "low"), ("other", "secret-other")):
                run = wait_for_run(name, timeout=120, project=project)
                assert run.status == "done", (project, name, run.status, run.termination_message)
        browser.get(f"{live_server.url}/projects/main/fleets/")
        assert browser.find_elements("css selector", 'section[aria-label="fleet local4"] p.queue-empty')
    finally:
        go.touch()
