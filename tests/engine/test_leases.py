"""Leases: held rows stay held while their holder works, and come free one lease after it stops."""

from __future__ import annotations

import time

import pytest

from engine import claims
from runs.models import Job
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet
from tests.waiting import patient

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _job(settings, lease: float):
    settings.MUSTER = {**settings.MUSTER, "LEASE_SECONDS": lease}
    fleet = local_project_fleet(size=1)
    run = submit_run(fleet.project, None, {"configuration": "type: task\nname: leased\ncommands: [echo]\n"})
    return run.current_jobs().get()


def test_a_held_row_is_renewed_past_its_lease_and_free_once_released(settings):
    # The renewer runs every third of a lease; on a loaded machine a round can be late by a second
    # or more, so the lease is scaled with the suite's patience (a late renewal is not the subject).
    lease = patient(1.5)
    job = _job(settings, lease=lease)
    token = claims.claim(Job, job.pk, status="submitted")
    assert token
    time.sleep(2.5 * lease)  # more than two leases: only the renewer keeps it
    assert claims.claim(Job, job.pk, status="submitted") is None, "a worker still at work keeps its row"
    job.refresh_from_db()
    assert job.lease_token == token
    assert claims.give_back(Job, job.pk, token, claims.Outcome())
    assert claims.claim(Job, job.pk, status="submitted"), "a released row can be claimed at once"


def test_a_row_whose_holder_stopped_renewing_is_free_after_one_lease(settings):
    job = _job(settings, lease=1.5)
    assert claims.claim(Job, job.pk, status="submitted")
    claims.forget_all()  # what a killed worker amounts to: nobody renews the lease any more
    assert claims.claim(Job, job.pk, status="submitted") is None
    time.sleep(2)
    assert claims.claim(Job, job.pk, status="submitted"), "the lease ran out and the row is claimable again"


def test_a_batch_claimed_without_renewal_runs_out(settings):
    job = _job(settings, lease=1.5)
    _, pks = claims.claim_batch(Job.objects.filter(pk=job.pk), 10, seconds=1, renew=False)
    assert pks == [job.pk]
    time.sleep(1.6)
    assert claims.claim(Job, job.pk, status="submitted"), "a lease meant to run out is not renewed"


def test_a_placed_job_is_handed_to_advance_job_only_after_its_lease_is_given_back(settings, monkeypatch):
    # The advance message used to leave from inside the provisioning attempt, while the attempt still
    # held the job: a free worker could take it at once, bounce off the claim, and leave the job to
    # the sweep, seconds later. Whatever the timing, the message must find the job claimable.
    from engine import tasks
    from engine.submitted import provision

    job = _job(settings, lease=15)
    found = []
    monkeypatch.setattr(tasks.advance_job, "delay", lambda job_id: found.append(
        (job_id, Job.objects.filter(pk=job_id).values_list("status", "lease_token").get())))
    assert provision.provision_job(job.pk)
    assert found == [(job.pk, ("provisioning", ""))], "sent once, with the job placed and its lease free"


def test_a_refused_claim_is_a_conflict_only_while_somebody_holds_the_row(settings):
    from muster.claimable import claim_conflict

    job = _job(settings, lease=30)
    conflicts = []

    def counted(sender, **kwargs):
        conflicts.append(sender)

    claim_conflict.connect(counted)
    try:
        token = claims.claim(Job, job.pk, status="submitted")
        assert token and claims.claim(Job, job.pk, status="submitted") is None
        assert conflicts == [Job], "held by another claim: a conflict"
        assert claims.claim(Job, job.pk, status="running") is None
        assert conflicts == [Job], "held, but not in the status asked for: it moved on, no conflict"
        claims.give_back(Job, job.pk, token, claims.Outcome())
        assert claims.claim(Job, 10 ** 9) is None and conflicts == [Job], "no such row: no conflict"
        assert claims.claim(Job, job.pk, status="submitted") and conflicts == [Job]
    finally:
        claim_conflict.disconnect(counted)
