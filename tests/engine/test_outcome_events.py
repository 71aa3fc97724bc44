"""An Outcome's events are written with its give-back, in its transaction: with the fields when the
step still holds its row (one row or a batch, and a row that moved under the step keeps what the
step learned), never when its lease was lost."""

from __future__ import annotations

import pytest

from engine import claims, outcome
from events.models import Event
from runs.models import Job
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet
from tests.engine.outcome_helpers import steal, stop_job

pytestmark = pytest.mark.django_db


def _jobs(count: int = 1) -> list[Job]:
    fleet = local_project_fleet(size=1, name="said")
    conf = f"type: task\nname: said\nnodes: {count}\ncommands: [echo]\n" if count > 1 else \
        "type: task\nname: said\ncommands: [echo]\n"
    run = submit_run(fleet.project, None, {"configuration": conf})
    return list(run.current_jobs().select_related("run").order_by("job_num"))


def _learned(job: Job, message: str) -> claims.Outcome:
    outcome.learn(job, event=outcome.event(job.run.project_id, f"job {job.run.name}/{job.job_num}", message,
                                           job_id=job.pk), waiting_for=message)
    return outcome.with_learned(job, expect=(job.status,))


def _said(message: str) -> list[int]:
    return list(Event.objects.filter(message=message).values_list("job_id", flat=True))


@pytest.mark.parametrize("meanwhile", [None, stop_job], ids=["held", "moved-under-it"])
def test_a_step_that_still_holds_its_row_writes_its_events_with_its_fields(meanwhile):
    [job] = _jobs()

    def body(held):
        said = _learned(job, "looked")
        if meanwhile:
            meanwhile(held)
        return said

    claims.claimed(Job, job.pk, "look", body)
    job.refresh_from_db()
    assert (job.waiting_for, _said("looked")) == ("looked", [job.pk])


def test_a_step_whose_lease_was_lost_writes_neither_its_fields_nor_its_events():
    [job] = _jobs()

    def body(held):
        said = _learned(job, "looked late")
        steal(Job)(held)
        return said

    claims.claimed(Job, job.pk, "look", body)
    job.refresh_from_db()
    assert (job.waiting_for, _said("looked late")) == ("", [])


def test_a_batch_writes_the_events_of_the_rows_it_gave_back_only():
    jobs = _jobs(3)
    lost = jobs[1]

    def body(held):
        said = {j.pk: _learned(j, f"looked at {j.job_num}") for j in jobs}
        Job.objects.filter(pk=lost.pk).update(lease_token="someone-else")
        return said

    held = claims.claimed_batch(Job.objects.filter(pk__in=[j.pk for j in jobs]), 10, "look", body)
    assert held.applied == {jobs[0].pk, jobs[2].pk}
    assert [_said(f"looked at {j.job_num}") for j in jobs] == [[jobs[0].pk], [], [jobs[2].pk]]
