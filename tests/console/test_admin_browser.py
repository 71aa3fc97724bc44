"""The Django admin's runs list in Chromium at 1400 px: every column of a wide list fits beside the
filter, none cut off behind a scroll bar at the foot of the page."""

from __future__ import annotations

import pytest

from tests.console.browser import needs_chromium, screenshot_dir, start, stop

pytestmark = [needs_chromium, pytest.mark.django_db(transaction=True), pytest.mark.slow]

PASSWORD = "admin-browser-password-1"


@pytest.fixture
def operator(django_user_model):
    from projects.models import Project

    user = django_user_model.objects.create_superuser(username="operator", password=PASSWORD)
    project, _ = Project.objects.get_or_create(name="main")
    return user, project


def test_the_runs_list_at_1400px_fits_every_column(live_server, operator):
    from instances.models import Fleet
    from runs.models import Run

    user, project = operator
    fleet = Fleet.objects.create(project=project, name="a-fleet-with-a-rather-long-name-for-width", backend="ssh",
                                 configuration={})
    for i in range(3):
        Run.objects.create(project=project, user=user, fleet=fleet, name=f"a-long-run-name-for-the-list-{i}",
                           configuration={"type": "task"}, submitted_text="type: task\n",
                           status="failed", termination_reason="waiting_peers_limit_exceeded")
    driver = start(width=1400, height=900)
    try:
        driver.get(f"{live_server.url}/admin/login/?next=/admin/runs/run/")
        driver.find_element("name", "username").send_keys("operator")
        driver.find_element("name", "password").send_keys(PASSWORD)
        driver.find_element("css selector", "input[type=submit]").click()
        driver.get(f"{live_server.url}/admin/runs/run/")
        seen = driver.execute_script("""
            const table = document.querySelector('#result_list');
            const last = table.querySelector('thead th:last-child');
            // the nearest box that clips the table, and whether it scrolls
            let box = table.parentElement, clip = null;
            while (box && box !== document.body) {
              const s = getComputedStyle(box);
              if (s.overflowX !== 'visible') { clip = box; break; }
              box = box.parentElement;
            }
            const r = last.getBoundingClientRect();
            const c = clip ? clip.getBoundingClientRect() : {right: window.innerWidth};
            return {lastRight: r.right, clipRight: c.right, viewport: document.documentElement.clientWidth,
                    clipOverflow: clip ? getComputedStyle(clip).overflowX : 'none',
                    clipId: clip ? (clip.id || clip.className) : '',
                    scrollable: clip ? clip.scrollWidth > clip.clientWidth : false,
                    pageScroll: document.documentElement.scrollWidth > document.documentElement.clientWidth};
        """)
        driver.save_screenshot(str(screenshot_dir() / "admin-runs-1400.png"))
        assert seen["lastRight"] <= min(seen["clipRight"], seen["viewport"]) + 1, seen
        assert not seen["scrollable"] and not seen["pageScroll"], seen
    finally:
        stop(driver)
