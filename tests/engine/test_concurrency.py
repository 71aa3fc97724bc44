"""Two jobs never get the same instance, also when several workers place at the same time."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from runs import placement
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_concurrent_claims_take_each_instance_once(fast_limits):
    fleet = local_project_fleet(size=4)
    run = submit_run(fleet.project, None, {"configuration": "type: task\nname: many\nnodes: 8\ncommands: [echo]\n"})
    jobs = list(run.current_jobs())
    taken, barrier = [], threading.Barrier(8)

    def take(job):
        try:
            barrier.wait()
            inst = placement.take_instance(job, fleet)
            if inst is not None:
                taken.append(inst.pk)
        finally:
            connection.close()

    threads = [threading.Thread(target=take, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(taken) == 4 and len(set(taken)) == 4, taken
