"""A worker SIGKILLed in the middle of a group restart: the sweep finishes the restart, once.

The worker is a process of its own, started with a hook that kills it (SIGKILL, no cleanup) in the
restart's last pass, inside the transaction that writes the new rows; a second, plain worker and
the sweep then have to find the run and restart the group exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.db import connection

from runs.models import Job, Run
from tests.engine.helpers import Beat, local_project_fleet, wait_for_run
from tests.waiting import job_states, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow,
              pytest.mark.skipif(connection.vendor != "postgresql" or not os.environ.get("CELERY_BROKER_URL"),
                                 reason="a worker process shares the database only on PostgreSQL + Redis")]

# Runs in the doomed worker before Celery starts: the restart dies after writing, before commit.
HOOK = """
import os, signal, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "muster.settings")
django.setup()
import engine.restarts as restarts
def die(*args, **kwargs):
    open(os.environ["MUSTER_TEST_KILLED"], "w").write("killed")
    os.kill(os.getpid(), signal.SIGKILL)
restarts.record_many = die
from celery.__main__ import main
sys.argv = ["celery"] + sys.argv[1:]
main()
"""


def _worker(name: str, env: dict, hook: bool) -> subprocess.Popen:
    args = ["-A", "muster", "worker", "--pool", "solo", "-Q", env["CELERY_TASK_DEFAULT_QUEUE"],
            "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--loglevel", "WARNING"]
    command = [sys.executable, "-c", HOOK, *args] if hook else [sys.executable, "-m", "celery", *args]
    return subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def test_a_worker_killed_while_restarting_a_group_leaves_the_restart_to_the_sweep_which_does_it_once(
        superuser_api, fast_limits, celery_config, tmp_path):
    local_project_fleet(size=2)
    db = connection.settings_dict
    killed = tmp_path / "killed"
    env = {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "CELERY_TASK_DEFAULT_QUEUE": celery_config["task_default_queue"], "MUSTER_JOB_POLL_INTERVAL": "0.2",
           "MUSTER_LEASE_SECONDS": "5", "MUSTER_SWEEP_INTERVAL": "0.5", "MUSTER_TEST_KILLED": str(killed)}
    conf = f"""
type: task
name: dies-restarting
groups:
  - name: head
    commands: [sleep 40]
  - name: worker
    on_failure: restart-group
    commands:
      - if [ ! -e {tmp_path}/failed-once ]; then touch {tmp_path}/failed-once; exit 1; fi
      - echo second attempt
"""
    workers = [_worker("doomed", env, hook=True)]
    try:
        with Beat(watch=True):
            answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
            assert answer.status_code == 201, answer.json()
            wait_until(killed.exists, 120, "the doomed worker to die in the restart")
            assert workers[0].wait(30) == -signal.SIGKILL
            run = Run.objects.get(name="dies-restarting")
            assert list(Job.objects.filter(run=run, node_group_name="worker").values_list("submission_num",
                                                                                           flat=True)) == [0]
            workers.append(_worker("heir", env, hook=False))
            run = wait_for_run("dies-restarting", timeout=120)
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGTERM)
        for w in workers:
            w.wait(30)
    assert run.status == "done", job_states(run)
    attempts = list(Job.objects.filter(run=run, node_group_name="worker").order_by("submission_num"))
    assert [(j.submission_num, j.status) for j in attempts] == [(0, "failed"), (1, "done")]
    assert attempts[0].instance_id == attempts[1].instance_id
    assert run.restarts["1"]["count"] == 1
