"""The console in a real browser: log in, watch a three-group run on the local backend live, read a
worker's log, open the fleets page. Screenshots are written as artifacts (the path is printed)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.conftest import client_for
from tests.console.browser import csp_violations, hosts_requested, needs_chromium, screenshot_dir, start, stop
from tests.waiting import wait_until

pytestmark = [needs_chromium, pytest.mark.django_db(transaction=True), pytest.mark.slow]

PASSWORD = "console-test-password-1"


def three_groups(go: Path) -> str:
    # every node waits for the test's go file, so the test sees it running and then done
    wait = f"while [ ! -e {go} ]; do sleep 0.2; done"
    return f"""type: task
name: pd-console
startup_order: workers-first
groups:
  - name: router
    nodes: 1
    commands:
      - echo "router up"
      - {wait}
  - name: prefill
    nodes: 1
    commands:
      - echo "prefill worker $DSTACK_NODE_RANK of $DSTACK_NODES_NUM"
      - {wait}
  - name: decode
    nodes: 1
    commands:
      - echo "decode worker $DSTACK_NODE_RANK of $DSTACK_NODES_NUM"
      - {wait}
"""


@pytest.fixture
def operator(db, django_user_model, fast_limits):
    """A superuser (only they may make local fleets) who logs in with a password."""
    from projects.models import Membership, Project

    user = django_user_model.objects.create_superuser(username="operator", password=PASSWORD)
    project, _ = Project.objects.get_or_create(name="main")
    Membership.objects.get_or_create(project=project, user=user, defaults={"role": "admin"})
    api = client_for(user)
    resp = api.post("/api/projects/main/fleets/", {"configuration": "type: fleet\nname: local4\nbackends: [local]\n"
                                                   "placement: cluster\nnodes: 4\n"}, format="json")
    assert resp.status_code == 201, resp.content
    yield user, api
    from engine.groups import terminate_fleet_instances
    from instances.models import Fleet

    for fleet in Fleet.objects.all():
        terminate_fleet_instances(fleet)


@pytest.fixture
def browser():
    driver = start()
    yield driver
    stop(driver)


def _settled(read, tries: int = 20):
    """`read()` again when the live page redrew what it was reading (the run picture is replaced on
    every status change; an element found just before is then stale)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(tries - 1):
        try:
            return read()
        except StaleElementReferenceException:
            time.sleep(0.1)
    return read()


def _node_status(driver, job_num: int) -> str | None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return driver.find_element("css selector", f'.picture g.node[data-job="{job_num}"]').get_attribute(
            "data-status")
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def test_an_operator_watches_a_three_group_run_live_and_reads_a_workers_log(operator, celery_worker, live_server,
                                                                           browser, tmp_path):
    from selenium.webdriver.support.ui import Select

    user, api = operator
    shots = screenshot_dir()
    go = tmp_path / "go"
    resp = api.post("/api/projects/main/runs/", {"configuration": three_groups(go)}, format="json")
    assert resp.status_code == 201, resp.content

    browser.get(live_server.url + "/")
    assert "/login/" in browser.current_url
    browser.find_element("id", "id_username").send_keys(user.username)
    browser.find_element("id", "id_password").send_keys(PASSWORD)
    browser.find_element("css selector", "form.login button").click()
    wait_until(lambda: "pd-console" in browser.page_source, 30, "the runs list after log in")
    browser.find_element("link text", "pd-console").click()
    wait_until(lambda: browser.find_elements("css selector", ".picture svg"), 30, "the run's picture")
    # a mark on this page: it survives only if nothing reloads the page
    browser.execute_script("window.museumPiece = 'not reloaded';")

    wait_until(lambda: all(_node_status(browser, n) == "running" for n in range(3)), 90,
               "all three nodes shown running (polled, no reload)")
    from runs.models import Run

    run = Run.objects.get(name="pd-console")
    jobs = list(run.current_jobs().select_related("instance"))
    svg = browser.find_element("css selector", "div.picture")
    groups = [g.get_attribute("data-group") for g in svg.find_elements("css selector", "g.group")]
    assert groups == ["router", "prefill", "decode"]
    text = svg.get_attribute("innerHTML")
    for job in jobs:
        assert f"global {job.job_num}" in text
        assert f"IP {job.instance.internal_ip}" in text and job.instance.internal_ip
    assert "starts 2nd (after the workers)" in text

    # every job's log at once (the default), each line led by its [group/rank] and a time
    wait_until(lambda: all(re.search(rf"^\[{g}/0\] \d\d:\d\d:\d\d {g}", browser.find_element("id", "log-text").text,
                                     re.M) for g in ("router", "prefill", "decode")), 30, "all three jobs' logs")
    select = Select(browser.find_element("id", "log-job"))
    select.select_by_value("1")
    wait_until(lambda: "prefill worker 1 of 3" in browser.find_element("id", "log-text").text, 30,
               "the prefill worker's log")
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(shots / "console-run.png"))

    # the fleets page in a second tab, while the jobs hold their hosts
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")
    browser.get(f"{live_server.url}/projects/main/fleets/")
    rows = browser.find_elements("css selector", "table.hosts tbody tr")
    assert len(rows) == 4
    page = browser.find_element("tag name", "main").text
    assert "pd-console/prefill/0" in page and "pd-console/router/0" in page
    assert "reachable" in page
    browser.save_screenshot(str(shots / "console-fleets.png"))
    browser.close()
    browser.switch_to.window(first)

    go.touch()
    wait_until(lambda: all(_node_status(browser, n) == "done" for n in range(3)), 90,
               "all three nodes shown done without a reload")
    wait_until(lambda: _settled(lambda: browser.find_element("id", "run-state").text) == "done", 30,
               "the run shown done")
    assert browser.execute_script("return window.museumPiece") == "not reloaded"
    events = browser.find_element("id", "events").text
    assert "run pd-console" in events

    # a phone's width: nothing wider than the screen but the scrollable picture and tables
    browser.set_window_size(390, 844)
    browser.refresh()
    wait_until(lambda: browser.find_elements("css selector", ".picture svg"), 30, "the run page on a phone")
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(shots / "console-run-phone.png"))

    assert csp_violations(browser) == [], "the console broke its own Content-Security-Policy"
    server = urlparse(live_server.url).netloc
    hosts = hosts_requested(browser)
    assert server in hosts, "the network log is read (it saw the test server)"
    assert hosts == {server}, f"the console loaded something from another host: {hosts}"


def _log_in(browser, live_server, user):
    browser.get(live_server.url + "/login/")
    browser.find_element("id", "id_username").send_keys(user.username)
    browser.find_element("id", "id_password").send_keys(PASSWORD)
    browser.find_element("css selector", "form.login button").click()
    wait_until(lambda: "/login/" not in browser.current_url, 30, "logged in")


def _group_boxes(browser) -> list[dict]:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('.picture-wrap g.group')).map(function (s) {"
        " var r = s.getBoundingClientRect(); return {top: Math.round(r.top), left: Math.round(r.left),"
        " right: Math.round(r.right)}; })")


def test_groups_sit_side_by_side_on_a_wide_screen_and_a_long_status_is_shown_whole(operator, live_server,
                                                                                 browser):
    """No worker runs: the jobs stay where the test puts them. At 1280 px the three groups share a
    row; on a phone they stack. A reason longer than a node is wider is drawn whole, and a job with
    no output says so."""
    from runs.choices import JobStatus
    from runs.models import Job, Run

    user, api = operator
    conf = ("type: task\nname: wide\ngroups:\n  - {name: router, nodes: 1, commands: [echo]}\n"
            "  - {name: prefill, nodes: 2, commands: [echo]}\n  - {name: decode, nodes: 1, commands: [echo]}\n")
    assert api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    run = Run.objects.get(name="wide")
    reason = "container_exited_with_error"
    Job.objects.filter(run=run, job_num=3).update(status=JobStatus.FAILED, termination_reason=reason, exit_status=1)
    _log_in(browser, live_server, user)
    browser.get(f"{live_server.url}/projects/main/runs/wide/")
    wait_until(lambda: len(browser.find_elements("css selector", ".picture-wrap g.group")) == 3, 30, "three groups")
    boxes = _group_boxes(browser)
    assert len({b["top"] for b in boxes}) == 1, f"the groups are not side by side at 1280 px: {boxes}"
    assert boxes[0]["right"] <= boxes[1]["left"] and boxes[1]["right"] <= boxes[2]["left"]
    def failed_node():
        node = browser.find_element("css selector", '.picture-wrap g.node[data-job="3"]')
        status = node.find_element("css selector", "text.status").text
        box = node.find_element("css selector", "rect").rect
        return node, status, box, [line.rect for line in node.find_elements("css selector", "text.status tspan")]

    node, status, box, lines = _settled(failed_node)
    # the lines break at the space: read without spaces, every character is there
    assert "".join(status.split()) == f"failed({reason})"
    # every line of the word inside its node's box: nothing clipped or spilling over
    for line in lines:
        assert box["x"] <= line["x"] and line["x"] + line["width"] <= box["x"] + box["width"]
        assert line["y"] + line["height"] <= box["y"] + box["height"] + 1
    wait_until(lambda: browser.find_element("id", "log-text").text == "No output yet.", 30, "the empty log state")
    assert "exit 1" in _settled(lambda: browser.find_element("css selector", '.picture-wrap g.node[data-job="3"]').text)

    browser.set_window_size(390, 844)
    browser.refresh()
    wait_until(lambda: len(browser.find_elements("css selector", ".picture-wrap g.group")) == 3, 30, "on a phone")
    tops = [b["top"] for b in _group_boxes(browser)]
    assert tops == sorted(tops) and len(set(tops)) == 3, f"the groups do not stack on a phone: {tops}"
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")


def test_a_run_of_many_nodes_opens_on_its_masters_log_and_a_few_on_every_jobs(operator, live_server, browser):
    from selenium.webdriver.support.ui import Select

    user, api = operator
    for name, nodes in (("few", 3), ("many", 17)):
        conf = f"type: task\nname: {name}\nnodes: {nodes}\ncommands: [echo]\n"
        assert api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    _log_in(browser, live_server, user)
    chosen = {}
    for name in ("few", "many"):
        browser.get(f"{live_server.url}/projects/main/runs/{name}/")
        wait_until(lambda: browser.find_element("id", "log-text").text == "No output yet.", 30, f"{name}'s log view")
        chosen[name] = Select(browser.find_element("id", "log-job")).first_selected_option.get_attribute("value")
        assert browser.find_element("id", "log-download").get_attribute("href").endswith(
            "/log.txt" if chosen[name] == "all" else "/log.txt?job=0")
    assert chosen == {"few": "all", "many": "0"}


def test_the_console_refuses_a_script_injected_into_its_page(django_user_model, live_server, browser):
    """What an escaping bug would let through: a <script> in the page. The policy stops it, and the
    console's own script (the log-in page's) still runs."""
    django_user_model.objects.create_user(username="viewer", password=PASSWORD)
    browser.get(live_server.url + "/login/")
    browser.execute_script("""
        const s = document.createElement('script');
        s.textContent = 'window.injected = 1';
        document.body.appendChild(s);
        document.body.insertAdjacentHTML('beforeend', '<img src="x:" onerror="window.injected = 2">');
    """)
    assert browser.execute_script("return window.injected") is None
    assert any("inline script" in m for m in csp_violations(browser))
    browser.find_element("id", "id_username").send_keys("viewer")
    browser.find_element("id", "id_password").send_keys(PASSWORD)
    browser.find_element("css selector", "form.login button").click()
    wait_until(lambda: urlparse(browser.current_url).path == "/", 30, "the runs list after log in")
    assert csp_violations(browser) == []


def test_a_group_restart_is_counted_on_the_run_page_and_the_failed_attempts_log_opens(
        operator, celery_worker, live_server, browser, tmp_path):
    from tests.engine.helpers import Beat, wait_for_run

    user, api = operator
    conf = f"""type: task
name: restarts-shown
groups:
  - name: head
    commands:
      - for _ in $(seq 600); do [ -e {tmp_path}/second ] && break; sleep 0.2; done
  - name: worker
    on_failure: restart-group
    commands:
      - if [ ! -e {tmp_path}/failed-once ]; then touch {tmp_path}/failed-once; echo "attempt one dies"; exit 1; fi
      - touch {tmp_path}/second
"""
    with Beat():  # the sweep starts the restart once its back-off is over
        assert api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
        wait_for_run("restarts-shown", timeout=120)
    _log_in(browser, live_server, user)
    browser.get(f"{live_server.url}/projects/main/runs/restarts-shown/")
    said = " ".join(browser.find_element("id", "restarts").text.split())
    assert "group worker: restarted 1 of 3 times; last for: job 1 (worker/0) exited 1" in said, said
    counts = [c.text for c in browser.find_elements("css selector", "table.jobs:not(.earlier) td.restarts")]
    assert counts == ["0", "1"], counts
    browser.find_element("css selector", "#earlier-jobs a.earlier-log").click()
    wait_until(lambda: "attempt one dies" in browser.find_element("tag name", "body").text, 30,
               "the failed attempt's log, shown in the browser")
