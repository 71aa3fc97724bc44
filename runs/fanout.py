"""The staged master-unlock fan-out (DESIGN.md section 6, the seed's proposal).

Job 0's attempt releases the rest of group 0 and the master of every other group, never the
other members of those groups, so nobody races a group master's batch. A group master's attempt
releases the rest of its own group.
"""

from __future__ import annotations

from django.db import transaction

from runs.models import Job


def release_set(job: Job, jobs: list[Job]) -> list[int]:
    """The job numbers that `job`'s provisioning attempt unlocks (pure: easy to test)."""
    if job.node_group_rank != 0:
        return []
    if job.job_num == 0:
        return sorted(
            j.job_num for j in jobs
            if j.job_num != 0 and (j.node_group_index == job.node_group_index or j.node_group_rank == 0)
        )
    return sorted(j.job_num for j in jobs if j.node_group_index == job.node_group_index and j.node_group_rank != 0)


def release_after_attempt(job: Job) -> list[int]:
    """Unlock the jobs `job` releases and enqueue their provisioning once this transaction commits."""
    from runs import tasks

    siblings = list(Job.objects.filter(run_id=job.run_id, submission_num=job.submission_num)
                    .only("id", "job_num", "node_group_index", "node_group_rank"))
    nums = release_set(job, siblings)
    if not nums:
        return []
    ids = list(Job.objects.filter(run_id=job.run_id, submission_num=job.submission_num, job_num__in=nums,
                                  waiting_master_job=True).values_list("id", flat=True))
    Job.objects.filter(id__in=ids).update(waiting_master_job=False)
    for job_id in ids:
        transaction.on_commit(lambda job_id=job_id: tasks.provision_job.delay(job_id))
    return nums
