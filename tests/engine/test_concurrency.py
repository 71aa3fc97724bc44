"""Two jobs never get the same instance, also when several workers place at the same time."""

from __future__ import annotations

import os
import threading

import pytest
from django.db import connection

from engine.submitted import placement
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet, worker_process

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_concurrent_claims_take_each_instance_once(fast_limits):
    fleet = local_project_fleet(size=4)
    run = submit_run(fleet.project, None, {"configuration": "type: task\nname: many\nnodes: 8\ncommands: [echo]\n"})
    jobs = list(run.current_jobs())
    taken, barrier = [], threading.Barrier(8)

    def take(job):
        try:
            barrier.wait()
            taken.extend(inst.pk for inst in placement.take_instances(fleet, job.spec["resources"], 1, run.project_id))
        finally:
            connection.close()

    threads = [threading.Thread(target=take, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(taken) == 4 and len(set(taken)) == 4, taken


@pytest.mark.skipif(connection.vendor != "postgresql" or not os.environ.get("CELERY_BROKER_URL"),
                    reason="two worker processes share the database only on PostgreSQL + Redis")
def test_two_worker_processes_on_postgresql_never_put_two_jobs_on_one_instance(fast_limits, celery_config):
    import signal
    from collections import defaultdict

    from runs.models import Job
    from tests.engine.helpers import Beat, job_summary, wait_for_run

    fleet = local_project_fleet(size=4)
    db = connection.settings_dict
    env = {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "MUSTER_TEST_QUEUE": celery_config["task_default_queue"], "CELERY_TASK_DEFAULT_QUEUE":
           celery_config["task_default_queue"],
           "MUSTER_JOB_POLL_INTERVAL": "0.2", "MUSTER_LEASE_SECONDS": "10",
           # the runs are submitted without a user, and local fleets take only superusers' runs by default
           "MUSTER_LOCAL_FLEET_MEMBERS": "1"}
    workers = [worker_process(f"w{i}", env) for i in range(2)]
    try:
        with Beat(watch=True):
            names = []
            for i in range(8):
                conf = (f"type: task\nname: burst-{i}\ncommands: [sleep 0.3]\n"
                        "retry: {on_events: [no-capacity], duration: 120s}\n")
                names.append(submit_run(fleet.project, None, {"configuration": conf}).name)
            runs = [wait_for_run(name, timeout=120) for name in names]
    finally:
        for w in workers:
            os.killpg(w.pid, signal.SIGTERM)
        for w in workers:
            w.wait(30)
    assert all(r.status == "done" for r in runs), [(r.name, job_summary(r)) for r in runs]
    spans = defaultdict(list)
    for job in Job.objects.filter(run__in=runs, status="done"):
        spans[job.instance_id].append((job.start_time, job.end_time))
    for intervals in spans.values():
        intervals.sort()
        for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
            assert start >= end, f"two jobs ran on one instance at once: {intervals}"

