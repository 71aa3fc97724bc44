"""The staged master-unlock fan-out: exact release sets for a 3-group run of sizes 3, 2, 2."""

from __future__ import annotations

import pytest

from engine.submitted.fanout import unlock_set
from engine.submitted.provision import provision_job
from runs.models import Job
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet

THREE_GROUPS = """
type: task
name: staged
groups:
  - {name: a, nodes: 3, commands: [echo a]}
  - {name: b, nodes: 2, commands: [echo b]}
  - {name: c, nodes: 2, commands: [echo c]}
"""


def _jobs(sizes):
    jobs, num = [], 0
    for g, size in enumerate(sizes):
        for r in range(size):
            jobs.append(Job(job_num=num, node_group_index=g, node_group_rank=r))
            num += 1
    return jobs


def test_unlock_sets_follow_the_staged_unlock():
    jobs = _jobs([3, 2, 2])
    assert unlock_set(jobs[0], jobs) == [1, 2, 3, 5]
    assert unlock_set(jobs[3], jobs) == [4]
    assert unlock_set(jobs[5], jobs) == [6]
    assert all(unlock_set(jobs[n], jobs) == [] for n in (1, 2, 4, 6))


@pytest.mark.django_db
def test_provisioning_releases_exactly_those_jobs_in_the_database(django_capture_on_commit_callbacks):
    fleet = local_project_fleet(size=7)
    with django_capture_on_commit_callbacks():
        run = submit_run(fleet.project, None, {"configuration": THREE_GROUPS})

    def waiting():
        return {j.job_num for j in run.current_jobs() if j.waiting_master_job}

    def provision(num):
        job = run.current_jobs().get(job_num=num)
        with django_capture_on_commit_callbacks() as enqueued:
            assert provision_job(job.pk)
        return enqueued

    assert waiting() == {1, 2, 3, 4, 5, 6}
    enqueued = provision(0)
    assert waiting() == set(), "on a static fleet job 0's gang step places every group's jobs"
    # each start is kept by the step (engine/messages.py `gathered`) and sent with the others once
    # it is over, as advance_jobs: the callbacks are the seven starts and that one send
    starts = [c for c in enqueued if c.__qualname__.startswith("advance_job")]
    assert len(starts) == 7 and len(enqueued) == 8, "a start for each placed job, no provisioning task for anyone"
    assert not provision_job(run.current_jobs().get(job_num=3).pk), "a group master placed by job 0 has nothing to do"
    assert not provision_job(run.current_jobs().get(job_num=0).pk), "a second attempt is a no-op"
    jobs = list(run.current_jobs())
    instances = [j.instance_id for j in jobs if j.instance_id]
    assert len(instances) == len(set(instances)) == 7, "job 0 placed the whole run on distinct hosts"
    assert {j.status for j in jobs} == {"provisioning"}, "members need no provisioning attempt of their own"
    for num in (1, 2, 4, 6):
        assert not provision_job(jobs[num].pk), "a member's own provisioning task finds nothing to do"
