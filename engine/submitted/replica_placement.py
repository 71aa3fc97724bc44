"""A service's replica placed on its own: no gang across replicas, no master unlock.

Each replica's node 0 is claimable from its submit (runs/job_rows.py) and takes the replica's hosts
(one, or `nodes` of them for a multi-host replica: all or none, in one fleet, the other nodes
placed with it as a task's group master places its members): the first fleet it may use (the
group's `fleets`, else the run's; its own earlier fleet first, for a replacement) with enough idle
hosts that fit its resources. A replica that finds none
waits for a host given back when some fleet would hold it once its busy hosts are free and either
the run's `retry` lists `no-capacity` or the service runs already (engine/submitted/waiting.py, as
job 0 of a task waits); otherwise it ends `failed_to_start_due_to_no_capacity`, which the
service's keeper (engine/replicas/keep.py) acts on. The other replicas are not touched either way.

On a fleet whose backend creates host groups (a TPU slice) the replica is one group of its own,
reserved by node 0 (engine/submitted/replica_groups.py): such a fleet is tried when its backend makes
a group of exactly the replica's `nodes` hosts for the replica's resources.
"""

from __future__ import annotations

from functools import partial

from django.db import transaction

from engine import claims
from engine.submitted import fanout, placement, replica_groups, waiting
from instances import fitting, shares, spanning
from instances.models import Fleet
from muster.claimable import Lease
from runs.choices import JobReason, JobStatus, RunStatus
from runs.models import Job, Run
from runs.transitions import end_job, move_job, move_run


def place_replica(job: Job, lease: Lease) -> dict | claims.Outcome:
    """provision_job's attempt for a service's replica: the fields its give-back writes (a wait),
    or the Outcome whose move ends it (no capacity, no wait)."""
    run = job.run
    req = job.spec["resources"]
    members = _members(job)
    need = 1 + len(members)
    fleets = _fleets_for(run, job, req, need)
    refused = shares.quota_refusals(fleets, run.project_id, [(req, need)])  # shared fleets over its quota
    for fleet in fleets:
        if fleet.pk in refused:
            continue
        if not fitting.is_static(fleet):
            return replica_groups.place(job, members, fleet, lease)
        # with the fleet's row locked, and on a shared fleet the quota asked again under the lock
        # (instances/shares.py `within`): the check above reads what the step read, and two replicas
        # placed at once would each find the project's last host of quota free
        taken, quota = placement.take_group(fleet, (job.node_group_index, job.node_group_name, req, need),
                                            run.project_id)
        if taken:
            _hold(run, job, fleet, taken, members, lease)
            return {}
        if quota:
            refused[fleet.pk] = quota
    full = [f for f in fleets if fitting.static_fleet_fits(f, [(req, need)], busy_too=True)]
    # a replica of a service that already serves (a scale-up, an update's new replica, a replacement)
    # waits for a host rather than failing the whole service for want of one
    if full and (run.status == RunStatus.RUNNING or waiting.retry_lets_it_wait(run)):
        return waiting.wait(job, next((refused[f.pk] for f in full if f.pk in refused), spanning.full_fleets(full)),
                            full[0])
    names = ", ".join(f.name for f in fleets) or "none the service may use"
    hosts = "no idle host fits it" if need == 1 else f"no {need} idle hosts fit it (nodes: {need}) in one fleet"
    why = (f"replica {job.node_group_name}/{job.replica_num}: {hosts} on fleets {names}"
           + ("" if full else " (none would, even with every host free)"))
    return claims.Outcome(move=partial(end_job, job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY, why))


def _members(head: Job) -> list[Job]:
    """The other nodes of a multi-host replica, still waiting for their node 0 to place them (one may
    point at a host already: an earlier try of this attempt planned the replica's slice, engine/pods.py)."""
    nodes = int(head.spec.get("nodes_in_group") or 1)
    if nodes == 1:
        return []
    # its own nodes by job number too: a node of an earlier replica of this number may still stop
    return list(Job.objects.filter(run_id=head.run_id, superseded=False, node_group_index=head.node_group_index,
                                   replica_num=head.replica_num, submission_num=head.submission_num,
                                   job_num__gt=head.job_num, job_num__lt=head.job_num + nodes,
                                   status=JobStatus.SUBMITTED, node_group_rank__gt=0)
                .select_related("run").order_by("node_group_rank"))


def _fleets_for(run: Run, job: Job, req: dict, need: int) -> list[Fleet]:
    usable = [f for f in fitting.candidate_fleets(run) if fitting.is_static(f) or replica_groups.takes(f, req, need)]
    own = spanning.group_fleet_names(run.configuration)
    fleets = spanning.candidates_per_group(usable, own, job.node_group_index + 1)[job.node_group_index]
    return sorted(fleets, key=lambda f: f.pk != job.fleet_id)  # its own earlier fleet first


def _hold(run: Run, job: Job, fleet: Fleet, hosts: list, members: list[Job], lease: Lease) -> None:
    host = hosts[0]
    with transaction.atomic():
        if not move_job(job, JobStatus.PROVISIONING, instance_id=host.pk, fleet_id=fleet.pk, lease=lease,
                        message=f"replica {job.node_group_name}/{job.replica_num} provisioning on {host.name} "
                                f"({host.internal_ip})", **waiting.placed(job)):
            waiting.hand_back(hosts, job, f"not used: job {run.name}/{job.job_num} ended before it was placed")
            return
        job.fleet = fleet
        if members:
            Job.objects.filter(pk__in=[m.pk for m in members]).update(fleet_id=fleet.pk)
            unused = fanout.place_members(job, members, hosts[1:], mine=host,
                                          taken=f"taken by job {run.name}/{job.job_num} for replica "
                                                f"{job.node_group_name}/{job.replica_num}")
            waiting.hand_back(unused, job, "not used: its job ended before it was placed")
        if run.fleet_id is None and not move_run(run, RunStatus.PROVISIONING, frm=[RunStatus.SUBMITTED], fleet=fleet,
                                                 message=f"placed on fleet {fleet.name}"):
            Run.objects.filter(pk=run.pk, fleet__isnull=True).update(fleet=fleet)
