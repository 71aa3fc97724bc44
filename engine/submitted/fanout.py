"""The staged master-unlock fan-out (docs/how-it-works.md, "From submission to done", step 3).

Job 0's attempt releases the rest of group 0 and the master of every other group, never the
other members of those groups, so nobody races a group master's batch. A group master's attempt
releases the rest of its own group.

On a static fleet the group master takes every member's host in its own attempt and moves the
members to `provisioning` with it (`place_members`), so the release finds them placed already and
only the other groups' masters get a provisioning task.
"""

from __future__ import annotations

from engine import messages
from events.services import record_many
from instances.transitions import taken_events
from runs.models import Job
from runs.transitions import place_on_hosts


def unlock_set(job: Job, jobs: list[Job]) -> list[int]:
    """The job numbers that `job`'s provisioning attempt unlocks (pure: easy to test)."""
    if job.node_group_rank != 0:
        return []
    if job.job_num == 0:
        return sorted(
            j.job_num for j in jobs
            if j.job_num != 0 and (j.node_group_index == job.node_group_index or j.node_group_rank == 0)
        )
    return sorted(j.job_num for j in jobs if j.node_group_index == job.node_group_index and j.node_group_rank != 0)


def unlock_after_attempt(job: Job, siblings: list[Job] | None = None) -> list[int]:
    """Unlock the jobs `job` unlocks (unlock_set) and enqueue their provisioning once this transaction commits.

    `siblings`: the run's current jobs as the caller read them (at least the fields used here).
    """
    if siblings is None:
        siblings = list(Job.objects.filter(run_id=job.run_id, superseded=False)
                        .only("id", "job_num", "node_group_index", "node_group_rank", "waiting_master_job"))
    nums = unlock_set(job, siblings)
    if not nums:
        return []
    # members the group master placed itself are not waiting any more (place_members updates them)
    ids = [j.pk for j in siblings if j.job_num in nums and j.waiting_master_job]
    if ids:
        Job.objects.filter(id__in=ids, waiting_master_job=True).update(waiting_master_job=False)
    for job_id in ids:
        messages.provision_job(job_id)
    return nums


def place_members(master: Job, members: list[Job], instances: list, mine=None, taken: str = "") -> list:
    """Give each waiting member of `master`'s group its host and move it to provisioning, all in
    the caller's transaction: one UPDATE and one INSERT of events, however large the group.

    `taken`: the message of the taken hosts' events (the master's `mine` and each placed member's),
    written in that same INSERT. Returns the instances of members that moved on meanwhile (a stop),
    for the caller to give back.
    """
    hosts = taken_events([mine], master, taken) if taken and mine is not None else []
    if not members:
        if hosts:
            record_many(master.run.project_id, hosts)
        return []
    pairs = {member.pk: instance for member, instance in zip(members, instances, strict=True)}
    placed = place_on_hosts(master, members, pairs, hosts, taken)
    for pk in placed:
        messages.advance_job(pk)
    return [instance for pk, instance in pairs.items() if pk not in placed]
