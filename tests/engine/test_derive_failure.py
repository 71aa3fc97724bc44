"""A derive that fails is not recorded as done, so the run is not wedged once the cause is gone."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from events.models import Event
from runs.models import Run
from runs.services.submission import submit_run
from tests.engine.helpers import Beat, local_project_fleet, wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _poll(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("condition not met before the deadline")


def test_a_failed_derive_leaves_the_run_to_the_sweep_and_says_why(fast_limits, celery_worker, settings):
    # with MUSTER_MAX_RETRY_DURATION the engine holds the stored duration below to the cap (runs.limits):
    # a server that turned the cap off still meets a duration that overflows
    settings.MUSTER = {**settings.MUSTER, "MAX_RETRY_DURATION": 0}
    fleet = local_project_fleet(size=1)
    conf = "type: task\nname: wedge\nnodes: 2\ncommands: [echo]\nretry: {on_events: [no-capacity], duration: 1h}\n"
    with Beat():
        with transaction.atomic():  # the worker hears of the run only once this commits
            run = submit_run(fleet.project, None, {"configuration": conf})
            # a duration stored before the parser bounded them: the retry deadline overflows
            configuration = {**run.configuration, "retry": {**run.configuration["retry"], "duration": 10**20}}
            Run.objects.filter(pk=run.pk).update(configuration=configuration)
        event = _poll(lambda: Event.objects.filter(run_id=run.pk, message__contains="could not derive").first())
        assert "OverflowError" in event.message
        assert Run.objects.get(pk=run.pk).status == "submitted"

        # the cause goes away (an operator fixes the row): the sweep derives the run again
        configuration["retry"]["duration"] = 0
        Run.objects.filter(pk=run.pk).update(configuration=configuration)
        done = wait_for_run("wedge", timeout=30)
    assert done.status == "failed" and done.termination_reason == "retry_limit_exceeded"
    assert Event.objects.filter(run_id=run.pk, message__contains="could not derive").count() == 1
