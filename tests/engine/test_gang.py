"""Gang placement: a run takes the hosts of every group at once, or none, with a real worker."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.db import connection

from instances.models import Instance, InstanceStatus
from runs.choices import JOB_ACTIVE
from runs.models import Job, Run
from tests.engine.helpers import (
    BackgroundLoop,
    Beat,
    job_summary,
    local_project_fleet,
    wait_for_run,
    worker_process,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUNS = "/api/projects/main/runs/"


def gang_run(name: str, seconds: float, duration: str = "120s") -> str:
    return f"""
type: task
name: {name}
groups:
  - {{name: a, nodes: 2, commands: [sleep {seconds}]}}
  - {{name: b, nodes: 2, commands: [sleep {seconds}]}}
retry: {{on_events: [no-capacity], duration: {duration}}}
"""


class Holders(BackgroundLoop):
    """Samples, every few milliseconds, which runs hold a busy host through an active job."""

    interval = 0.01

    def __init__(self):
        super().__init__()
        self.both: list[set[int]] = []
        self.samples = 0

    def tick(self) -> None:
        holding = set(Job.objects.filter(status__in=JOB_ACTIVE, instance__status=InstanceStatus.BUSY)
                      .values_list("run_id", flat=True))
        self.samples += 1
        if len(holding) > 1:
            self.both.append(holding)


def test_a_fleet_one_host_short_takes_no_host_and_names_the_short_group(superuser_api, fast_limits, celery_worker):
    fleet = local_project_fleet(size=3)
    with Beat():
        answer = superuser_api.post(RUNS, {"configuration": gang_run("short", 0.2, "6s")}, format="json")
        assert answer.status_code == 201, answer.content
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # while the run waits and tries again, no host is taken
            assert not Instance.objects.filter(fleet=fleet).exclude(status=InstanceStatus.IDLE).exists(), \
                list(Instance.objects.filter(fleet=fleet).values_list("name", "status"))
            time.sleep(0.05)
        run = wait_for_run("short", timeout=60)
    assert run.status == "failed", job_summary(run)
    assert Job.objects.filter(run=run, instance__isnull=False).count() == 0
    messages = set(Job.objects.filter(run=run, job_num=0).values_list("termination_message", flat=True))
    assert messages and all("b is 1 short (needs 2, 1 idle left)" in m for m in messages), messages
    assert run.retry_attempts >= 1  # the whole run tried again
    assert set(Instance.objects.filter(fleet=fleet).values_list("status", flat=True)) == {InstanceStatus.IDLE}


@pytest.mark.skipif(connection.vendor != "postgresql" or not os.environ.get("CELERY_BROKER_URL"),
                    reason="two worker processes share the database only on PostgreSQL + Redis")
def test_two_runs_racing_for_four_hosts_never_both_hold_hosts_and_both_finish(superuser_api, fast_limits,
                                                                              celery_config):
    fleet = local_project_fleet(size=4)
    db = connection.settings_dict
    env = {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "MUSTER_TEST_QUEUE": celery_config["task_default_queue"], "CELERY_TASK_DEFAULT_QUEUE":
           celery_config["task_default_queue"], "MUSTER_JOB_POLL_INTERVAL": "0.2", "MUSTER_LEASE_SECONDS": "10"}
    workers = [worker_process(f"w{i}", env) for i in range(2)]
    finished: list[Run] = []
    try:
        with Beat(watch=True), Holders() as holders:
            time.sleep(3)  # both workers up, so the two submissions are placed at the same time
            for rnd in range(3):
                names = [f"race-{rnd}-{k}" for k in range(2)]
                for name in names:
                    answer = superuser_api.post(RUNS, {"configuration": gang_run(name, 0.5)}, format="json")
                    assert answer.status_code == 201, answer.content
                finished += [wait_for_run(name, timeout=120) for name in names]
    finally:
        for w in workers:
            os.killpg(w.pid, signal.SIGTERM)
        for w in workers:
            w.wait(30)
    assert holders.samples > 100
    assert not holders.both, f"two runs held hosts at once {len(holders.both)} times: {holders.both[:3]}"
    assert all(r.status == "done" for r in finished), [(r.name, r.status, job_summary(r)) for r in finished]
    for first, second in zip(finished[::2], finished[1::2], strict=True):  # one after the other
        a, b = sorted([first, second], key=lambda r: r.current_jobs().order_by("start_time")[0].start_time)
        assert max(j.end_time for j in a.current_jobs()) <= min(j.start_time for j in b.current_jobs())
    assert set(Instance.objects.filter(fleet=fleet).values_list("status", flat=True)) == {InstanceStatus.IDLE}
