"""A drained worker of a PD service is stopped only once no router lists it (what the last router
sync saw, RouterSync.listed), and at the latest ROUTER_DRAIN_WAIT past its drain delay, with an event
naming the router that still did (engine/replicas/keep.py), in the test process, no worker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine import processing
from engine.tuning import ROUTER_DRAIN_WAIT
from runs.models import Job, Run
from runs.services.submission import submit_run
from serving.models import RouterSync
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db(transaction=True)

PD = """type: service
name: pd
port: 8000
groups:
  - name: router
    replicas: 1
    router: {type: smg}
    commands: [smg launch --pd-disaggregation]
  - name: decode
    replicas: 2
    commands: [python3 -m serving.standin --role decode]
"""


def _drained(sent, ago: float) -> tuple[Run, Job, Job]:
    fleet = local_project_fleet(size=3)
    run = submit_run(fleet.project, None, {"configuration": PD})
    Job.objects.filter(run=run).update(status="running", ready_at=timezone.now())
    Run.objects.filter(pk=run.pk).update(status="running", desired_replicas={"router": 1, "decode": 1})
    router = Job.objects.get(run=run, node_group_name="router")
    victim = Job.objects.filter(run=run, node_group_name="decode").order_by("-job_num").first()
    Job.objects.filter(pk=victim.pk).update(drain_at=timezone.now() - timedelta(seconds=ago), ready_at=None)
    return run, router, victim


def test_a_drained_worker_a_router_still_lists_runs_on_until_it_is_dropped(sent):
    run, router, victim = _drained(sent, ago=10)  # past the drain delay (5 s)
    RouterSync.objects.create(run=run, listed={str(router.pk): {str(victim.pk): "w1"}})
    assert processing.process_run(run.pk)
    victim.refresh_from_db()
    run.refresh_from_db()
    assert victim.status == "running", "the router still sends to it"
    assert run.next_retry_at is not None and run.next_retry_at <= timezone.now() + timedelta(seconds=3)
    RouterSync.objects.filter(pk=run.pk).update(listed={str(router.pk): {}})  # the sync saw it gone
    assert processing.process_run(run.pk)
    victim.refresh_from_db()
    assert victim.status in ("terminating", "terminated") and "still listed" not in victim.termination_message


def test_a_router_that_never_drops_it_holds_it_a_bounded_time_and_the_stop_says_so(sent):
    run, router, victim = _drained(sent, ago=5 + ROUTER_DRAIN_WAIT + 1)
    RouterSync.objects.create(run=run, listed={str(router.pk): {str(victim.pk): "w1"}})
    assert processing.process_run(run.pk)
    victim.refresh_from_db()
    assert victim.status in ("terminating", "terminated")
    assert f"router job(s) {router.pk} still listed it" in victim.termination_message, victim.termination_message
