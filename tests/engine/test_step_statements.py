"""The statements each engine step sends for one run, counted: a claim is one round trip, a state
change and its event one more, and no step reads again what it already holds.

Statement counts are the stable figure of placement on a loaded machine (docs/performance.md). The
steps run in the test's thread, one message at a time, so every statement they send is captured:
the messages the engine sends are caught and each becomes one call, in the order sent; the watch
tick runs when nothing else is due. The jobs run on a local fleet (real runner agents and job
processes).
"""

from __future__ import annotations

import collections
import heapq
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from engine import finishing, messages
from engine.processing import process_run
from engine.running.watch import watch_running
from engine.starting.advance import advance_job
from engine.submitted.provision import provision_job
from runs.models import Job, Run
from runs.services.submission import submit_run
from tests.engine.helpers import job_summary, local_project_fleet
from tests.waiting import patient

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STEPS = {"provision_job": provision_job, "advance_job": advance_job, "finish_job": finishing.finish_job,
         "process_run": process_run}


def drive(monkeypatch, run: Run) -> dict[str, list[list[str]]]:
    """Every message the run's steps send, run when due (a countdown is kept) until the run has
    ended; the SQL of each call by step."""
    queue: list[tuple[float, int, str, int]] = []

    def send(name: str, pk: int, countdown: float = 0) -> None:
        connection.on_commit(lambda: heapq.heappush(queue, (time.monotonic() + countdown, len(queue), name, pk)))

    for name in STEPS:
        monkeypatch.setattr(messages, name, lambda pk, countdown=0, _n=name: send(_n, pk, countdown))
    # the last of a run's jobs to end nudges it (engine.nudges.matters_only_last): due() after commit
    monkeypatch.setattr(messages, "process_run_if", lambda pk, due: connection.on_commit(
        lambda: due() and heapq.heappush(queue, (time.monotonic(), len(queue), "process_run", pk))))
    send("provision_job", Job.objects.get(run=run, job_num=0).pk)
    calls: dict[str, list[list[str]]] = collections.defaultdict(list)
    deadline = time.monotonic() + patient(60)
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.finished and not queue:
            return calls
        if not queue or queue[0][0] > time.monotonic():
            with CaptureQueriesContext(connection) as q:
                looked = watch_running()
            if looked:
                calls["watch_running"].append([s["sql"] for s in q])
            time.sleep(0.05)
            continue
        _, _, name, pk = heapq.heappop(queue)
        with CaptureQueriesContext(connection) as q:
            STEPS[name](pk)
        calls[STEPS[name].__name__].append([s["sql"] for s in q])
    raise AssertionError(f"run {run.name} did not end: {run.status} {job_summary(run)}")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement forms are PostgreSQL's")
def test_each_claim_and_each_state_change_of_a_run_is_one_round_trip(monkeypatch, fast_limits):
    fleet = local_project_fleet(size=4)
    run = submit_run(fleet.project, None, {"configuration": "type: task\nnodes: 4\ncommands: [echo]\n"})
    calls = drive(monkeypatch, run)
    run.refresh_from_db()
    assert run.status == "done", job_summary(run)
    every = [sql for step in calls.values() for call in step for sql in call]
    # claims: one UPDATE ... WHERE pk IN (SELECT ... FOR UPDATE SKIP LOCKED), in autocommit; a claim
    # of one row asks in the same statement whether somebody else holds it (engine/claims.py)
    for step, step_calls in calls.items():
        for call in step_calls:
            assert call[0].startswith(("UPDATE", "WITH taken AS (UPDATE")) and "FOR UPDATE SKIP LOCKED" in call[0], \
                (step, call[:2])
    # a job's or a run's status change carries its event in the same statement
    moves = [sql for sql in every if sql.startswith(('UPDATE "runs_job" SET "status"', 'UPDATE "runs_run" SET "status"'))]
    assert not moves, moves
    assert sum(1 for sql in every if sql.startswith('WITH moved AS (UPDATE "runs_job" SET "status"')) >= 4 * 3
    # a savepoint only where a gang's take of one group may be given back alone (placement.take_instances)
    for step, step_calls in calls.items():
        for call in step_calls:
            assert sum(1 for sql in call if sql.startswith("SAVEPOINT")) <= (1 if step == "provision_job" else 0), \
                (step, call)
    # finish_job marks the job's attach grants once, reads none when it has none, and has the project
    for call in calls["finish_job"]:
        assert sum(1 for sql in call if sql.startswith('UPDATE "runs_attachgrant"')) <= 1, call
        assert not [sql for sql in call if 'FROM "runs_attachgrant"' in sql], call
        assert not [sql for sql in call if sql.startswith('SELECT "projects_project"')], call
    # placement reads the run's user with the job, not on its own
    assert not [sql for call in calls["provision_job"] for sql in call if 'FROM "auth_user"' in sql]
    # the members' hosts, moves and events (theirs and their hosts') are one statement (runs/rows.place)
    for call in calls["provision_job"]:
        assert not [sql for sql in call if sql.startswith(('INSERT INTO "events_event"', 'UPDATE "runs_job" SET "instance_id"'))], call
    # a host given back while no run waits for one sends no admission look: no release is counted
    assert not [sql for call in calls["finish_job"] for sql in call if '"instances_fleetqueue"' in sql]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement forms are PostgreSQL's")
def test_a_large_run_that_finds_no_capacity_is_torn_down_in_a_handful_of_statements(monkeypatch, fast_limits):
    """Job 0 fails for no capacity; the derive ends the 63 others with one statement for their
    moves and events, and finishes the run: no statement per job, nothing derived twice."""
    fleet = local_project_fleet(size=2)
    run = submit_run(fleet.project, None, {"configuration": "type: task\nnodes: 64\ncommands: [echo]\nretry: false\n"})
    calls = drive(monkeypatch, run)
    run.refresh_from_db()
    assert run.status == "failed" and run.termination_reason == "job_failed"
    jobs = list(run.current_jobs().order_by("job_num").values_list("status", "termination_reason"))
    assert jobs == [("failed", "failed_to_start_due_to_no_capacity")] + [("terminated", "terminated_by_server")] * 63
    assert len(calls["provision_job"]) == 1 and len(calls["provision_job"][0]) <= 8, calls["provision_job"]
    assert len(calls["process_run"]) == 1, "the run is finished in the derive that ends its jobs: no second derive"
    assert len(calls["process_run"][0]) <= 10, calls["process_run"][0]
    ends = list(run.events.filter(job__isnull=False, status="terminated").order_by("job__job_num")
                .values_list("subject", "message", "job__job_num"))
    assert ends == [(f"job {run.name}/{n}", "terminated (terminated_by_server)", n) for n in range(1, 64)]


def test_the_watch_reads_a_batchs_fleet_once_not_with_every_jobs_row(monkeypatch, fast_limits):
    """An SSH fleet's row holds its configuration with every host in it: joined to each running
    job's row, each look decoded the whole list again (docs/performance.md, the watch)."""
    fleet = local_project_fleet(size=4)
    run = submit_run(fleet.project, None, {"configuration": "type: task\nnodes: 4\ncommands: [sleep 2]\n"})
    calls = drive(monkeypatch, run)
    run.refresh_from_db()
    assert run.status == "done", job_summary(run)
    assert calls["watch_running"], "the jobs ran long enough to be looked at"
    for call in calls["watch_running"]:
        reads = [sql for sql in call if sql.startswith("SELECT") and 'FROM "runs_job"' in sql]
        assert reads and not [sql for sql in reads if '"instances_fleet"' in sql], reads
        # one batch here (up to WATCH_BATCH jobs): its fleet once
        assert sum(1 for sql in call if sql.startswith("SELECT") and 'FROM "instances_fleet"' in sql) == 1, call
