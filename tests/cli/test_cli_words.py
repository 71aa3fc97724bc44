"""The words the CLI and the API use for what happened to a run (issue 20, item 7): reasons that
say who ended a job, no container words for a job without a container, and what `stop` does.

Each test drives the real `muster` CLI in its own process against a live server, a real Celery
worker and the local backend's runner agents."""

from __future__ import annotations

import pytest

from events.models import Event
from runs.models import Run
from tests.cli.test_cli_live import local_fleet, muster, write  # noqa: F401 - fixtures
from tests.engine.helpers import runner_processes, wait_for_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MASTER_DONE = """\
type: task
name: master-ends
nodes: 3
startup_order: workers-first
stop_criteria: master-done
commands:
  - if [ "$DSTACK_NODE_RANK" = 0 ]; then echo master finished; else sleep 419; fi
"""

PROCESS_FAILS = """\
type: task
name: process-fails
nodes: 2
commands:
  - if [ "$DSTACK_NODE_RANK" = 1 ]; then exit 5; else sleep 421; fi
"""


def _ps_rows(muster, name: str) -> list[list[str]]:  # noqa: F811
    ps = muster("ps", "-v")
    assert ps.returncode == 0, ps.stderr
    return [line.split() for line in ps.stdout.splitlines()[1:] if line.split()[:1] == [name]]


def test_workers_stopped_because_the_master_finished_say_master_done(
        muster, local_fleet, celery_worker, tmp_path):  # noqa: F811
    applied = muster("apply", "-f", write(tmp_path, MASTER_DONE), "-y")
    assert applied.returncode == 0, applied.stderr

    rows = _ps_rows(muster, "master-ends")
    # RUN JOB GROUP RANK HOST IP STATUS RESTARTS READY REASON: the master finished its commands, the workers did not
    assert [(r[1], r[6], r[9]) for r in rows] == [("0", "done", "done_by_runner"), ("1", "done", "master_done"),
                                                  ("2", "done", "master_done")], rows
    assert runner_processes("sleep 419") == []
    run = Run.objects.get(name="master-ends")
    assert (run.status, run.termination_reason) == ("done", "master_job_done")
    events = muster("events", "master-ends")
    assert events.stdout.splitlines()[-1].endswith("done (master_job_done)"), events.stdout


def test_a_job_without_an_image_never_says_pulling_and_fails_as_a_process(
        muster, local_fleet, celery_worker, tmp_path):  # noqa: F811
    applied = muster("apply", "-f", write(tmp_path, PROCESS_FAILS), "-y")
    assert applied.returncode == 1, applied.stderr

    out = applied.stdout + applied.stderr
    assert "pulling" not in out and "container" not in out, out
    rows = _ps_rows(muster, "process-fails")
    assert [(r[1], r[6], r[9]) for r in rows] == [("0", "terminated", "terminated_by_server"),
                                                  ("1", "failed", "process_exited_with_error")], rows
    run = Run.objects.get(name="process-fails")
    assert not Event.objects.filter(run=run, status="pulling").exists()
    events = muster("events", "process-fails")
    assert "pulling" not in events.stdout and "container" not in events.stdout, events.stdout


def test_stop_says_the_run_is_stopping(muster, local_fleet, celery_worker, tmp_path):  # noqa: F811
    conf = "type: task\nname: long\nnodes: 1\ncommands: [sleep 423]\n"
    assert muster("apply", "-f", write(tmp_path, conf), "-y", "-d").returncode == 0
    wait_for_run("long", statuses=("running",), timeout=60)
    wait_until(lambda: runner_processes("sleep 423"), timeout=60, what="the job's command running")

    stopped = muster("stop", "long", "-y")

    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("run long: stopping"), stopped.stdout
    assert "running" not in stopped.stdout
    assert wait_for_run("long").status == "terminated"
    aborted = muster("stop", "long", "-y")  # ended already: it says so
    assert aborted.stdout.strip() == "run long: terminated", aborted.stdout
