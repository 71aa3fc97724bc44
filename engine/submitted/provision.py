"""The provisioning chain: a released job claims itself, finds capacity, and unlocks the next jobs."""

from __future__ import annotations

import logging

from django.db import transaction

from backends.base import BackendError
from backends.registry import fleet_backend_config, get_compute
from engine import claims, messages, pods
from engine.job_leases import release_job
from engine.submitted import fanout, placement
from engine.tuning import NO_CAPACITY_MESSAGE_LIMIT
from instances import fitting
from instances.transitions import hand_back, record_taken
from runs.choices import JOB_FINISHED, JobReason, JobStatus, RunStatus
from runs.models import Job, Run
from runs.transitions import move_job, move_run, terminate_job

log = logging.getLogger(__name__)


def provision_job(job_id: int) -> bool:
    """Task body. Returns True when this call did the provisioning attempt."""
    with claims.claimed(Job, job_id, "provision_job", status=JobStatus.SUBMITTED, waiting_master_job=False) as held:
        if held is None:
            return False
        job = Job.objects.select_related("run", "run__project", "run__fleet", "instance").get(pk=job_id)
        _attempt(job)
        status = release_job(job, held.token, AFTER_ATTEMPT)
    if held.failed:
        return True  # due again after the backoff (the sweep sends it)
    if status == JobStatus.PROVISIONING:
        # Sent only now that the lease is given back: sent from inside the attempt, the message
        # could reach an idle worker while this task still held the job, bounce off the claim and
        # leave the job to the sweep (three sweep intervals later).
        messages.start_job(job_id)
    return True


# Where an attempt leaves its job when nobody needs to hand it to finish_job.
AFTER_ATTEMPT = (JobStatus.SUBMITTED, JobStatus.PROVISIONING, *JOB_FINISHED)


def _attempt(job: Job) -> None:
    run = job.run
    if run.stop_requested or run.status not in (RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING):
        return  # the run is ending; process_run terminates this job
    if job.instance_id is not None:  # a group master's batch already gave this job its host
        with transaction.atomic():
            move_job(job, JobStatus.PROVISIONING, message=f"provisioning on {job.instance.name} (group batch)")
            fanout.unlock_after_attempt(job)
        return
    # A group master reads its siblings once: for the fleet choice, its members and the fan-out.
    siblings = list(run.current_jobs().only(*SIBLING_FIELDS)) if job.node_group_rank == 0 else None
    if run.fleet_id is None:
        fleet = fitting.choose_fleet(run, siblings)
        if fleet is None:
            terminate_job(job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY, _no_capacity(run, siblings), held=True)
            return
        if not move_run(run, RunStatus.PROVISIONING, frm=[RunStatus.SUBMITTED], fleet=fleet,
                        message=f"placed on fleet {fleet.name}"):
            Run.objects.filter(pk=run.pk, fleet__isnull=True).update(fleet=fleet)
            run.refresh_from_db(fields=["fleet"])
    fleet = run.fleet
    if fitting.is_static(fleet):
        _take_static_instance(job, fleet, siblings)
    else:
        _provision_cloud_group(job, fleet)


SIBLING_FIELDS = ("id", "run_id", "job_num", "node_group_index", "node_group_rank", "node_group_name", "status",
                  "instance_id", "waiting_master_job", "spec")


def _no_capacity(run: Run, siblings: list[Job] | None) -> str:
    """The failure message: per group, which requirement no host met (instances/fitting.py `explain`)."""
    jobs = siblings if siblings is not None else list(run.current_jobs().only(*SIBLING_FIELDS))
    groups = fitting.groups_of(jobs, lambda j: j.node_group_name, lambda j: j.node_group_index,
                               lambda j: j.spec["resources"])
    lines = fitting.explain(run.project_id, run.configuration.get("fleets") or [], groups, run.configuration,
                            local=fitting.local_allowed(run.user))
    text = "no fleet can hold every group of this run: " + " | ".join(lines)
    return text if len(text) <= NO_CAPACITY_MESSAGE_LIMIT else text[:NO_CAPACITY_MESSAGE_LIMIT - 3] + "..."


def _take_static_instance(job: Job, fleet, siblings: list[Job] | None) -> None:
    """Job 0 takes a host for every waiting job of the run at once (the gang); a later group master
    (a group placed again) takes its whole group; others take one."""
    if job.job_num == 0:
        members = sorted((j for j in siblings or [] if j.pk != job.pk and j.status == JobStatus.SUBMITTED
                          and j.instance_id is None), key=lambda j: j.job_num)
        instances, short = _take_gang(fleet, job, members)
        if short:
            terminate_job(job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY,
                          f"gang not placed, no host taken: {' | '.join(short)}", held=True)
            return
        what = f"the run's {len({j.node_group_index for j in [job, *members]})} groups"
    else:
        members = [j for j in siblings or [] if j.node_group_index == job.node_group_index and j.node_group_rank > 0
                   and j.status == JobStatus.SUBMITTED and j.instance_id is None]
        instances = placement.take_instances(fleet, job.spec["resources"], 1 + len(members))
        if not instances:
            terminate_job(job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY,
                          f"no {1 + len(members)} idle instances of fleet {fleet.name} fit {job.node_group_name}",
                          held=True)
            return
        what = f"its group {job.node_group_name}"
    mine, theirs = instances[0], instances[1:]
    with transaction.atomic():
        if not move_job(job, JobStatus.PROVISIONING, instance_id=mine.pk,
                        message=f"provisioning on {mine.name} ({mine.internal_ip})"):
            # the job moved on under us (stopped): give the hosts back
            hand_back(instances, job, f"not used: job {job.run.name}/{job.job_num} ended before it was placed")
            return
        unused = fanout.place_members(job, members, theirs)
        hand_back(unused, job, "not used: its job ended before it was placed")
        record_taken([i for i in instances if i not in unused], job,
                     f"taken by job {job.run.name}/{job.job_num} for {what}")
        fanout.unlock_after_attempt(job, siblings)


def _take_gang(fleet, master: Job, members: list[Job]) -> tuple[list, list[str]]:
    """Hosts for `master` and `members` from one all-or-nothing take (placement.take_gang), in the
    order [master's, then each member's in the order given]; or ([], the short groups)."""
    jobs = [master, *members]
    groups: dict[int, list[Job]] = {}
    for j in jobs:
        groups.setdefault(j.node_group_index, []).append(j)
    taken, short = placement.take_gang(fleet, [(g, js[0].node_group_name, js[0].spec["resources"], len(js))
                                              for g, js in sorted(groups.items())])
    if short:
        return [], short
    given = {g: iter(insts) for g, insts in taken.items()}
    return [next(given[j.node_group_index]) for j in jobs], []


def _provision_cloud_group(job: Job, fleet) -> None:
    """A backend that creates groups makes the whole group in one call (a TPU pod slice)."""
    compute = get_compute(fleet.backend, fleet_backend_config(fleet))
    group_jobs = list(job.run.current_jobs().filter(node_group_index=job.node_group_index))
    try:
        assigned = pods.reserve_pod(fleet, compute, group_jobs)
    except BackendError as exc:
        terminate_job(job, exc.reason, str(exc), held=True)
        return
    if not assigned:
        terminate_job(job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY, f"fleet {fleet.name} has no offer for "
                      f"{job.node_group_name}", held=True)
        return
    with transaction.atomic():
        for other in group_jobs:
            Job.objects.filter(pk=other.pk, instance__isnull=True).update(instance_id=assigned[other.pk])
        move_job(job, JobStatus.PROVISIONING, instance_id=assigned[job.pk],
                 message=f"provisioning {len(group_jobs)} hosts as one group")
        fanout.unlock_after_attempt(job)
