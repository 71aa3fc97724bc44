"""A multi-host replica (`nodes: N`) kept as one unit: N jobs of one replica_num, node 0 the head.

keep.py hands a replica here once one of its nodes has ended: the others are stopped (a replica
missing a node serves nothing right: LWS's RecreateGroupOnPodRestart), and once every node has
ended they get a new submission together. After an error the replica comes back on the hosts it
had: the nodes stopped here keep theirs busy when they end (`Job.keep_host`, engine/finishing.py),
and so do the nodes that failed with an error when the service retries errors
(failure_policy.keeps_host: a TPU replica's slice would be deleted once all its hosts were idle);
a failed node's host given back when it ended is taken again if still idle. After an
interruption (a host lost), or when a host was taken meanwhile, the kept hosts are given back and
node 0 places the whole replica anew (engine/submitted/replica_placement.py).

Written by process_run while it holds the run, like the rest of keep.py.
"""

from __future__ import annotations

from django.db import transaction

from engine.failure_policy import INTERRUPTION, event_of
from engine.replicas import rows
from engine.restarts import Lost, cause_text, reused_host
from engine.submitted.waiting import hand_back
from runs.choices import FAILING_REASONS, JobReason, JobStatus
from runs.models import Job, Run
from runs.transitions import terminate_job


def key(job: Job) -> tuple[str, int, int]:
    """One replica's nodes, and no other's: its group, its number and its node 0's job number (a
    replica's nodes take consecutive job numbers, kept by its restarts; a new replica takes numbers
    above any the run used). A replica number is used again once its replica is gone, and a node of
    the old one may still be stopping then: it must not join the new replica's unit."""
    return job.node_group_name, job.replica_num, job.job_num - job.node_group_rank


def nodes_of(job: Job) -> int:
    return int((job.spec or {}).get("nodes_in_group") or 1)


def multi_node(jobs: list[Job]) -> dict[tuple[str, int, int], list[Job]]:
    """The multi-host replicas with a node that has ended, each as its current jobs in rank order."""
    units: dict[tuple[str, int, int], list[Job]] = {}
    for job in jobs:
        if nodes_of(job) > 1 and not job.superseded:
            units.setdefault(key(job), []).append(job)
    return {k: sorted(v, key=lambda j: j.node_group_rank) for k, v in units.items() if any(j.finished for j in v)}


def others_of(live: list[Job]) -> dict[tuple[str, int, int], list[Job]]:
    """Each multi-host replica's nodes other than node 0, which are drained with it."""
    out: dict[tuple[str, int, int], list[Job]] = {}
    for job in live:
        if job.node_group_rank != 0:
            out.setdefault(key(job), []).append(job)
    return out


def cause_of(ended: list[Job]) -> Job:
    """The node the replica restarts for: the first that failed, else the first that ended."""
    failed = [j for j in ended if j.termination_reason in FAILING_REASONS]
    return min(failed or ended, key=lambda j: (j.status_changed_at, j.node_group_rank))


def said(cause: Job) -> str:
    return f"node {cause.node_group_rank}: {cause_text(cause)}"


def stop_the_rest(nodes: list[Job], cause: Job) -> None:
    """Every node still active stopped, keeping its host for the restart unless the cause was an
    interruption (the replica then moves)."""
    keep_host = event_of(cause) != INTERRUPTION
    for job in nodes:
        if job.finished or job.status == JobStatus.TERMINATING:
            continue
        terminate_job(job, JobReason.TERMINATED_BY_SERVER,
                      f"replica {job.node_group_name}/{job.replica_num} restarts as one: {said(cause)}",
                      keep_host=keep_host and job.instance_id is not None)


def let_go(nodes: list[Job], ended: list[Job]) -> None:
    """A replica removed (drained, rolled out, its group gone) with a node ended: the ended nodes
    left behind, the rest stopped now (a replica short of a node serves nothing right)."""
    for job in ended:
        if rows.supersede(job) and job.keep_host:
            _hand_back_kept([job])
    for job in nodes:
        if not job.finished and job.status != JobStatus.TERMINATING:
            terminate_job(job, JobReason.TERMINATED_BY_SERVER,
                          f"replica {job.node_group_name}/{job.replica_num} removed, and a node of it ended")


def restart(run: Run, nodes: list[Job], cause: Job, why: str) -> list[Job]:
    """The new submission of every node (all ended), on the same hosts when it may and can."""
    if event_of(cause) != INTERRUPTION:
        try:
            with transaction.atomic():  # all the hosts again and the new rows on them, or nothing
                fresh = rows.replace_replica(run, nodes, [reused_host(j, j.node_group_index) for j in nodes], why)
                if not fresh:
                    transaction.set_rollback(True)
                return fresh
        except Lost:
            pass  # a host was taken meanwhile (or never had): the replica moves
    _hand_back_kept(nodes)
    return rows.replace_replica(run, nodes, None, f"{why}; on new hosts")


def _hand_back_kept(nodes: list[Job]) -> None:
    kept = [j for j in nodes if j.keep_host and j.instance_id is not None]
    for job in kept:
        with transaction.atomic():
            if Job.objects.filter(pk=job.pk, keep_host=True).update(keep_host=False):
                hand_back([job.instance], job, f"given back: replica {job.node_group_name}/{job.replica_num} "
                                               "moves to new hosts")
