"""Live logs of a running job on an SSH host, read by many through the REST API.

The host's sshd allows few logins in progress (MaxStartups 3:100:3), as a host hardened against
connection floods does; a read-only member reads the running job's log from 30 threads at once.
Reads are served from the server's copy, which the watch of the job keeps up to date over its own
connection: the host sees the watcher's logins, never one per read.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from runs.services.submission import submit_run
from tests.conftest import client_for
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import fleet_configuration, needs_netns, registered_fleet
from tests.waiting import job_states, patient, wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]

LINES = 40
PRINTER = f"""
type: task
name: printer
fleets: [solo]
commands:
  - for i in $(seq 1 {LINES}); do echo "tick $i $(date +%s.%N)"; sleep 0.25; done
"""
SLEEPER = """
type: task
name: sleeper
fleets: [solo]
commands:
  - echo "printed before the host went away"
  - sleep 300
"""
READERS = 30
POLL = 0.5  # the watch's interval (JOB_POLL_INTERVAL): how often it logs in to the host
# Each request in flight holds a database connection of its own (the readers are threads of this
# process). Two suites beside each other on one PostgreSQL (max_connections 100) ran out of them
# with 30 at once, so at most this many reads are in flight; the 30 readers still follow the log.
IN_FLIGHT = threading.BoundedSemaphore(10)


class Reader(threading.Thread):
    """Follows the log as `muster logs` does: GET .../logs?start=<next> until the job is over."""

    def __init__(self, client, deadline: float):
        super().__init__(daemon=True)
        self.client, self.deadline = client, deadline
        self.text, self.reads, self.seen_at, self.errors = "", 0, {}, []

    def run(self) -> None:
        try:
            while time.monotonic() < self.deadline:
                try:
                    resp = self._read()
                except Exception as exc:  # the test client raises a view's exception: said, not lost with the thread
                    self.errors.append(repr(exc)[:300])
                    return
                self.reads += 1
                if resp.status_code != 200:
                    self.errors.append(resp.status_code)
                    continue
                body = resp.json()
                self.text += body["text"]
                for line in self.text.split("\n")[:-1]:  # whole lines only
                    if line.startswith("tick "):
                        self.seen_at.setdefault(line, time.time())
                if body["status"] in ("done", "failed", "terminated") and not body["text"]:
                    return
                time.sleep(0.1)
        finally:
            connection.close()

    def _read(self):
        with IN_FLIGHT:
            try:
                return self.client.get("/api/projects/main/runs/printer/logs", {"job": 0, "start": len(self.text)})
            finally:
                connection.close()  # given back before the next reader's turn


def logins(host) -> int:
    return host.sshd_log.count("Accepted publickey")


def test_thirty_readers_of_a_running_jobs_log_get_it_live_and_cost_the_host_no_ssh_login_each(
        ssh_hosts, project, make_user, fast_limits, settings, celery_worker):
    # The rate per user is not what protects the host here: 30 readers may as well be 30 members.
    settings.MUSTER = {**settings.MUSTER, "JOB_POLL_INTERVAL": POLL, "THROTTLE_USER": ""}
    (host,) = ssh_hosts(1, mode="netns")
    host.reconfigure_sshd(max_startups="3:100:3")
    registered_fleet(project, {"configuration": fleet_configuration(host.pool, name="solo")}, actor="test")
    reader = client_for(make_user("viewer", role="read-only"))

    run = submit_run(project, None, {"configuration": PRINTER})
    deadline = time.monotonic() + 90
    while not run.current_jobs().filter(status="running").exists():
        assert time.monotonic() < deadline, job_states(run)
        time.sleep(0.1)
    before, began = logins(host), time.monotonic()
    readers = [Reader(reader, time.monotonic() + 60) for _ in range(READERS)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(70)
    window, during = time.monotonic() - began, logins(host) - before

    reads, dropped = sum(r.reads for r in readers), host.sshd_log.count("past MaxStartups")
    print(f"{READERS} readers, {reads} reads in {window:.1f}s; the host saw {during} SSH logins, dropped {dropped}")

    run = wait_for_run(run.name, timeout=30)
    assert run.status == "done", job_states(run)
    assert dropped == 0, "sshd dropped connections past MaxStartups"
    # the watch logs in once per look (every POLL seconds) whoever reads; a read never does
    assert during <= window / POLL + 10, f"{during} logins for {reads} reads in {window:.1f}s"
    assert reads > 5 * during

    want = [line for line in _full_log(run).splitlines() if line.startswith("tick ")]
    assert len(want) == LINES
    for r in readers:
        assert not r.errors, r.errors
        assert [line for line in r.text.splitlines() if line.startswith("tick ")] == want, "the whole log, in order"
        # live: each line reached the reader within a few seconds of the job printing it (a few
        # more on a loaded machine, where a watch tick can be late: 6.7 s was seen at load 5)
        lags = [r.seen_at[line] - float(line.split()[2]) for line in want if line in r.seen_at]
        assert len(lags) == LINES and max(lags) < patient(5), f"lags {min(lags):.2f}..{max(lags):.2f}s"


def _full_log(run) -> str:
    from runs.services import logs

    return logs.read(run.current_jobs().get(job_num=0)).decode()


def test_a_running_jobs_log_is_read_from_the_servers_copy_while_its_host_refuses_logins(
        ssh_hosts, project, make_user, fast_limits, celery_worker):
    (host,) = ssh_hosts(1, mode="netns")
    registered_fleet(project, {"configuration": fleet_configuration(host.pool, name="solo")}, actor="test")
    reader = client_for(make_user("viewer", role="read-only"))
    run = submit_run(project, None, {"configuration": SLEEPER})

    def log_text() -> str:
        resp = reader.get("/api/projects/main/runs/sleeper/logs", {"job": 0})
        assert resp.status_code == 200, resp.content
        return resp.json()["text"]

    wait_until(lambda: "printed before the host went away" in log_text(), 90, "the line in the log")
    host.stop_sshd()  # new logins are refused from here on
    try:
        assert "printed before the host went away" in log_text()
    finally:
        wait_for_run(run.name, timeout=60)  # instance_unreachable after UNREACHABLE_GRACE
