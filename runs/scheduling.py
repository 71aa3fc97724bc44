"""The provisioning chain: a released job claims itself, finds capacity, and unlocks the next jobs."""

from __future__ import annotations

import logging

from django.db import transaction

from backends.base import BackendError
from backends.registry import fleet_backend_config, get_compute
from muster import claims
from runs import fanout, placement
from runs.choices import JobReason, JobStatus, RunStatus
from runs.models import Job, Run
from runs.transitions import hand_over_if_terminating, move_job, move_run, nudge_job, terminate_job

log = logging.getLogger(__name__)


def on_run_submitted(run: Run) -> None:
    """Called inside the submit transaction: job 0 is claimable at once."""
    from runs import tasks

    master = run.current_jobs().get(job_num=0)
    transaction.on_commit(lambda: tasks.provision_job.delay(master.pk))


def provision_job(job_id: int) -> bool:
    """Task body. Returns True when this call did the provisioning attempt."""
    token = claims.claim(Job, job_id, status=JobStatus.SUBMITTED, waiting_master_job=False)
    if token is None:
        return False
    try:
        _attempt(Job.objects.select_related("run", "run__project", "run__fleet", "instance").get(pk=job_id))
    finally:
        claims.release(Job, job_id, token)
        hand_over_if_terminating(job_id)
    return True


def _attempt(job: Job) -> None:
    run = job.run
    if run.stop_requested or run.status not in (RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING):
        return  # the run is ending; process_run terminates this job
    if job.instance_id is not None:  # a group master's batch already gave this job its host
        with transaction.atomic():
            move_job(job, JobStatus.PROVISIONING, message=f"provisioning on {job.instance.name} (group batch)")
            fanout.release_after_attempt(job)
            nudge_job(job.pk)
        return
    if run.fleet_id is None:
        fleet = placement.choose_fleet(run)
        if fleet is None:
            terminate_job(job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY,
                          "no fleet can hold every group of this run")
            return
        Run.objects.filter(pk=run.pk, fleet__isnull=True).update(fleet=fleet)
        run.refresh_from_db(fields=["fleet"])
        move_run(run, RunStatus.PROVISIONING, frm=[RunStatus.SUBMITTED], message=f"placed on fleet {run.fleet.name}")
    fleet = run.fleet
    if placement.is_static(fleet):
        _take_static_instance(job, fleet)
    else:
        _provision_cloud_group(job, fleet)


def _take_static_instance(job: Job, fleet) -> None:
    instance = placement.take_instance(job, fleet)
    if instance is None:
        terminate_job(job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY,
                      f"no idle instance of fleet {fleet.name} fits {job.node_group_name}")
        return
    with transaction.atomic():
        if not move_job(job, JobStatus.PROVISIONING, instance_id=instance.pk,
                        message=f"provisioning on {instance.name} ({instance.internal_ip})"):
            # the job moved on under us (stopped): give the host back
            from runs.stopping import release_instance

            release_instance(instance.pk)
            return
        fanout.release_after_attempt(job)
        nudge_job(job.pk)


def _provision_cloud_group(job: Job, fleet) -> None:
    """A backend that creates groups makes the whole group in one call (a TPU pod slice)."""
    from instances import pods

    compute = get_compute(fleet.backend, fleet_backend_config(fleet))
    group_jobs = list(job.run.current_jobs().filter(node_group_index=job.node_group_index))
    try:
        assigned = pods.reserve_pod(fleet, compute, group_jobs)
    except BackendError as exc:
        terminate_job(job, exc.reason, str(exc))
        return
    if not assigned:
        terminate_job(job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY, f"fleet {fleet.name} has no offer for "
                      f"{job.node_group_name}")
        return
    with transaction.atomic():
        for other in group_jobs:
            Job.objects.filter(pk=other.pk, instance__isnull=True).update(instance_id=assigned[other.pk])
        move_job(job, JobStatus.PROVISIONING, instance_id=assigned[job.pk],
                 message=f"provisioning {len(group_jobs)} hosts as one group")
        fanout.release_after_attempt(job)
        nudge_job(job.pk)
