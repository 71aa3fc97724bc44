"""A service replica on a backend that creates host groups (a TPU pod slice): the replica is the group.

Node 0 of the replica reserves one group for the replica's `nodes` jobs (engine/pods.py, as a task's
group does: an idle group of the same shape in the fleet, else a new one), node k on host k, and
moves its other nodes to provisioning with it. The backend's plan decides the hosts per group; the
configuration already made the replica's `nodes` that number (a written `nodes` that disagrees is
a 400). The group is the replica's own (named by its replica number) and is deleted once no job of
it is left (engine/pods.py expire_idle_pods), so a scaled-down, rolled-out or stopped replica leaves
nothing billed. A group the provider takes back ends every node as an interruption
(engine/pod_watch.py), and the keeper restarts the replica as one, on a new group
(engine/replicas/nodes.py), while the other replicas serve.
"""

from __future__ import annotations

from functools import partial

from django.db import transaction

from backends.base import BackendError
from backends.registry import compute_class, fleet_backend_config, get_compute
from engine import claims, messages, pods
from engine.submitted import waiting
from instances.models import Fleet
from muster.claimable import Lease
from runs.choices import JobReason, JobStatus
from runs.models import Job
from runs.transitions import end_job, move_job


def takes(fleet: Fleet, req: dict, nodes: int) -> bool:
    """Whether the fleet's backend makes one group of exactly `nodes` hosts for these resources."""
    plan = compute_class(fleet.backend).plan_group(req, nodes)
    return plan is not None and plan.hosts == nodes


def place(job: Job, members: list[Job], fleet: Fleet, lease: Lease) -> dict | claims.Outcome:
    """Node 0's attempt on a group-creating fleet: {} once placed (or ended meanwhile), or the Outcome
    that ends it (no offer, no capacity in any zone, a create refused)."""
    what = f"replica {job.node_group_name}/{job.replica_num}"
    try:
        assigned = pods.reserve_pod(fleet, get_compute(fleet.backend, fleet_backend_config(fleet)),
                                    [job, *members], replica=True)
    except BackendError as exc:
        return claims.Outcome(move=partial(end_job, job, exc.reason, f"{what}: {exc}"))
    if not assigned:
        return claims.Outcome(move=partial(end_job, job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY,
                                           f"{what}: fleet {fleet.name} has no offer for it"))
    hosts = len(assigned)
    with transaction.atomic():
        if not move_job(job, JobStatus.PROVISIONING, instance_id=assigned[job.pk], fleet_id=fleet.pk, lease=lease,
                        message=f"{what} provisioning on host 0 of {hosts} of one group", **waiting.placed(job)):
            return {}  # stopped meanwhile: the group, unused, is deleted as soon as it is idle
        job.fleet = fleet
        for member in members:
            # nobody holds a member (it waits for its node 0: waiting_master_job), so no lease here
            if move_job(member, JobStatus.PROVISIONING, frm=[JobStatus.SUBMITTED], instance_id=assigned[member.pk],
                        fleet_id=fleet.pk, waiting_master_job=False,
                        message=f"{what} provisioning on host {member.node_group_rank} of {hosts}, placed by its "
                                f"node 0"):
                messages.advance_job(member.pk)
    return {}
