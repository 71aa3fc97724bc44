"""Groups a backend creates (TPU pod slices on gcp) as instance groups: reserve (reuse or create),
poll until ready, expire when idle. Only the backend contract (backends/base.py) is used here.

A group of H hosts is one InstanceGroup of kind `tpu_pod` named by its backend (`group_name`), with
one Instance per host whose `index` is the worker id. Rows exist, and the group's jobs point at
them, before the backend is asked to create anything: a crash between the two is found by the
poll sweep, never leaked, and whichever poll sees READY first knows which hosts are taken.

Polling is self-rescheduling (like engine.starting.advance.advance_job): the create enqueues a poll, and a
poll that finds the slice still on its way enqueues the next one. The beat sweep re-enqueues a
poll for every provisioning pod as the safety net for lost messages.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from backends.base import BackendError, Compute, GroupPlan, GroupProgress, NoCapacityError, ProvisioningData
from backends.registry import (
    compute_for_group,
    fleet_backend_config,
    group_backend_config,
    group_noun,
    kept_for_group,
)
from engine import claims, messages, outcome
from engine.claims import unleased
from engine.nudges import is_service
from engine.submitted import gang
from engine.tuning import POD_BATCH
from events.services import record
from instances.lookup import group_in_use
from instances.models import (
    Fleet,
    GroupKind,
    GroupStatus,
    Instance,
    InstanceGroup,
    InstanceReason,
    InstanceStatus,
)
from instances.queued import queued_view
from instances.transitions import NOT_TERMINATED, end_group, move_group, move_instances
from muster import crypto
from muster.claimable import Lease
from runs.choices import JobReason, JobStatus
from runs.configuration.stored import run_configuration
from runs.models import Job
from runs.transitions import terminate_job

log = logging.getLogger(__name__)

# Job statuses that still wait for their host to come up.
_WAITING = (JobStatus.SUBMITTED, JobStatus.PROVISIONING)
NOT_TERMINATED_GROUP = [status for status in GroupStatus.values if status != GroupStatus.TERMINATED]
# backend_data's mark of a pod made for one service replica: deleted once idle, whatever the fleet's
# idle_duration (a replica's slice is billed for its replica alone: scale-down, update and stop end it)
REPLICA_POD = "service_replica"


def poll_interval() -> float:
    """Seconds between looks at a slice being created (creation takes minutes on Google Cloud)."""
    muster = settings.MUSTER
    return float(muster["POD_POLL_INTERVAL"] or 5 * float(muster["JOB_POLL_INTERVAL"]))


def reserve_pod(fleet: Fleet, compute: Compute, group_jobs: list, replica: bool = False) -> dict[int, int]:
    """Give job k of the group host k of one pod: an idle pod of the same shape, else a new one.

    Returns {job id: instance id}; {} when the fleet has no offer for the slice. A capacity or
    API error is raised after the planned rows are marked terminated. `replica`: the jobs are one
    service replica (engine/submitted/replica_groups.py): its pod is its own (named by its replica
    number too) and is deleted as soon as no job uses it (expire_idle_pods).
    """
    slices = slices_of(group_jobs[0])
    plan = compute.plan_group(group_jobs[0].spec["resources"], len(group_jobs) // slices)
    if plan is None or len(group_jobs) != plan.hosts * slices:
        return {}
    jobs = sorted(group_jobs, key=lambda j: j.node_group_rank)
    reused = _reuse_idle_pod(fleet, plan.shape, len(jobs), jobs[0].run.project_id, slices, replica)
    if reused is not None:
        return {job.pk: inst.pk for job, inst in zip(jobs, reused, strict=True)}
    offers = compute.get_offers(jobs[0].spec["resources"])
    if not offers:
        return {}
    group, instances = _plan_pod(fleet, compute, plan, slices, jobs, replica)
    try:
        progress = compute.create_group(offers[0], len(jobs), group.name)
    except NoCapacityError as exc:
        _forget(group, str(exc), delete=slices > 1)
        raise
    except BackendError as exc:
        if exc.transient:
            # The API may have taken the create: the rows stay, and polls find the node by its id.
            progress = GroupProgress(None, {})
        else:
            _forget(group, f"create failed: {exc}", delete=slices > 1)
            raise
    if _keep(group, progress):  # nobody holds the new group: written now
        InstanceGroup.objects.filter(pk=group.pk).update(backend_data=group.backend_data)
    if progress.records:
        apply_ready(group, progress.records)
    else:
        schedule_poll(group.pk)
    return {job.pk: inst.pk for job, inst in zip(jobs, instances, strict=True)}


def schedule_poll(group_id: int, countdown: float | None = None) -> None:
    messages.poll_pod(group_id, poll_interval() if countdown is None else countdown)


def slices_of(job) -> int:
    """The slices of the job's group: 1, or N for a multislice set (`slices: N`)."""
    return run_configuration(job.run).group(job.node_group_index).slices


def _reuse_idle_pod(fleet: Fleet, shape: str, hosts: int, holder_id: int, slices: int = 1,
                    replica: bool = False) -> list[Instance] | None:
    for group in InstanceGroup.objects.filter(fleet=fleet, kind=GroupKind.TPU_POD, shape=shape,
                                              status=GroupStatus.ACTIVE).order_by("created"):
        if int(group.backend_data.get("slices") or 1) != slices:
            continue  # a set is reused only as the same set
        with transaction.atomic():
            # Conditional on every host still idle and the group still active: the idle policy
            # takes a pod the same way, so exactly one of the two wins it.
            taken = move_instances(list(group.instances.filter(status=InstanceStatus.IDLE)), InstanceStatus.BUSY,
                                   frm=[InstanceStatus.IDLE], where={"group__status": GroupStatus.ACTIVE},
                                   message=f"taken with instance group {group.name}: reused by a new run",
                                   idle_since=None, holder_id=holder_id)
            if len(taken) == hosts:
                if replica:  # taken by a service replica: it goes with that replica
                    InstanceGroup.objects.filter(pk=group.pk).update(backend_data={**group.backend_data,
                                                                                   REPLICA_POD: True})
                return list(group.instances.order_by("index"))
            transaction.set_rollback(True)  # a partly busy pod is not ours to take
    return None


def _plan_pod(fleet: Fleet, compute: Compute, plan: GroupPlan, slices: int,
              jobs: list, replica: bool = False) -> tuple[InstanceGroup, list[Instance]]:
    master = jobs[0]
    label, attempt = master.node_group_name, f"{master.run_id}/{master.node_group_index}/{master.submission_num}"
    if replica:  # replicas of one group share its index and submission: each gets a pod of its own
        # (node 0's job_num too: a replica number used again later is another replica, another pod)
        label, attempt = f"{label}-{master.replica_num}", f"{attempt}/{master.replica_num}/{master.job_num}"
    name = compute.group_name(master.run.name, label, attempt)
    with transaction.atomic():
        planned = (InstanceGroup.objects.select_for_update()
                   .filter(project=fleet.project, name=name, kind=GroupKind.TPU_POD,
                           status=GroupStatus.PROVISIONING).first())
        if planned is not None:
            # An earlier try of this attempt planned it (and may have created the node): carry on.
            instances = list(planned.instances.order_by("index"))
            for job, inst in zip(jobs, instances, strict=True):
                Job.objects.filter(pk=job.pk, instance__isnull=True).update(instance=inst)
            return planned, instances
        group = InstanceGroup.objects.create(
            project=fleet.project, fleet=fleet, name=name, kind=GroupKind.TPU_POD, shape=plan.shape,
            status=GroupStatus.PROVISIONING,
            backend_data={"backend": fleet.backend, "fleet": kept_for_group(fleet),
                          **({"slices": slices} if slices > 1 else {}),
                          **({REPLICA_POD: True} if replica else {})},
        )
        instances = [
            Instance.objects.create(
                project=fleet.project, fleet=fleet, group=group, index=k, name=f"{name}-{k}",
                status=InstanceStatus.PROVISIONING, backend=fleet.backend, username=_ssh_user(fleet),
                holder_id=master.run.project_id,  # made for the group's jobs, pointed at it below
            )
            for k in range(plan.hosts * slices)
        ]
        # Point job k at host k now, in the same transaction, so a poll that sees READY before
        # the scheduler finishes still knows these hosts are taken (busy, not idle).
        for job, inst in zip(jobs, instances, strict=True):
            Job.objects.filter(pk=job.pk, instance__isnull=True).update(instance=inst)
        what = f"{slices} x {plan.shape} slices" if slices > 1 else f"a {plan.shape} slice"
        record(fleet.project_id, f"instance group {name}", f"creating {what} ({plan.hosts * slices} hosts)",
               status=GroupStatus.PROVISIONING)
    return group, instances


def _ssh_user(fleet: Fleet) -> str:
    return fleet_backend_config(fleet).get("ssh_user") or "root"


def _forget(group: InstanceGroup, why: str, delete: bool = False) -> None:
    """The create call failed: nothing exists in the cloud, so the rows end here. With `delete`
    (a multislice set, whose backend deleted the slices it made) the group is deleted once more
    as the safety net for a delete that did not get through (nobody holds the new group yet, so
    its terminate_group is sent now)."""
    end, host_end = ((GroupStatus.TERMINATING, InstanceStatus.TERMINATING) if delete
                     else (GroupStatus.TERMINATED, InstanceStatus.TERMINATED))
    with transaction.atomic():
        Job.objects.filter(instance__group=group, status=JobStatus.SUBMITTED).update(instance=None)
        move_instances(list(group.instances.exclude(status=InstanceStatus.TERMINATED)), host_end,
                       frm=NOT_TERMINATED, message=f"not created: {why}", termination_reason=why[:64])
        if move_group(group, end, frm=NOT_TERMINATED_GROUP, message=f"not created: {why}") and delete:
            messages.terminate_group(group.pk)


def _keep(group: InstanceGroup, progress: GroupProgress) -> bool:
    """Keep where the create stands (zone, operation, zones refused) for the next poll, on the copy;
    True when there is something to write."""
    if not progress.backend_data:
        return False
    group.backend_data = {**group.backend_data, **progress.backend_data}
    return True


def apply_ready(group: InstanceGroup, records: list[ProvisioningData], lease: Lease | None = None) -> None:
    """The slice is READY: fill in each host (worker k -> instance k) and hand it to its job. `lease`:
    the poll's hold on the group (a group reserve just made is held by nobody)."""
    key = group_backend_config(group).get("ssh_private_key", "")
    encrypted = crypto.encrypt(key) if key else ""
    now = timezone.now()
    with transaction.atomic():
        for rec in records:
            inst = group.instances.get(index=rec.worker_index)
            holder = _waited_for_by(inst)
            assigned = holder is not None
            move_instances(
                [inst], InstanceStatus.BUSY if assigned else InstanceStatus.IDLE, frm=[InstanceStatus.PROVISIONING],
                message=f"ready at {rec.internal_ip} (worker {rec.worker_index} of {group.name})",
                hostname=rec.hostname, internal_ip=rec.internal_ip, port=rec.port or 22, region=rec.region,
                resources=rec.resources or {}, **Instance.resource_columns(rec.resources),
                backend_data=rec.backend_data, private_key_encrypted=encrypted, idle_since=None if assigned else now,
                holder_id=holder,
            )
        move_group(group, GroupStatus.ACTIVE, frm=[GroupStatus.PROVISIONING],
                   message=f"ready with {len(records)} hosts in {records[0].region or 'its zone'}",
                   backend_data={**group.backend_data, **records[0].backend_data}, lease=lease)


def poll_pod(group_id: int) -> bool:
    """Task body: look at a slice being created; READY fills the hosts, stuck or failed deletes it."""
    return claims.claimed(InstanceGroup, group_id, "poll_pod", _poll, status=GroupStatus.PROVISIONING) is not None


# a pod that turned terminating while a poll held it (a user's delete): its delete bounced off the poll
HAND_OVER = {GroupStatus.TERMINATING: messages.terminate_group}


def _poll(held: claims.Held) -> claims.Outcome:
    group = InstanceGroup.objects.select_related("fleet").get(pk=held.pk)
    status = _poll_once(group, held.lease)
    follow = {GroupStatus.PROVISIONING: (partial(schedule_poll, group.pk),),
              GroupStatus.TERMINATING: (partial(messages.terminate_group, group.pk),)}.get(status, ())
    # `updated` marks the last poll, so the sweep only re-enqueues polls that got lost.
    return outcome.with_learned(group, expect=(status,), updated=timezone.now(), then=follow, hand_over=HAND_OVER)


def _poll_once(group: InstanceGroup, lease: Lease) -> str:
    """One look at the slice; the status it leaves the pod in (`provisioning`: look again). `lease`: the
    poll's hold on the group, which each of its moves takes."""
    limit = float(settings.MUSTER["WAITING_INSTANCE_LIMIT"])
    waited = (timezone.now() - group.created).total_seconds()
    replaced = (group.backend_data.get("create") or {}).get("replaced_at")
    if replaced:  # a slice of a live set being made again counts from its loss (engine/slice_replace.py)
        waited = time.time() - float(replaced)
    records, failure, reason = None, "", ""
    queued = queued_view(group) is not None
    try:
        compute = compute_for_group(group)
        before = queued_view(group)
        progress = compute.poll_group(group.name, group.shape, group.backend_data)
        if _keep(group, progress):
            outcome.learn(group, backend_data=group.backend_data)  # written with the poll's give-back
        records, queued = progress.records, progress.queued
        if progress.started_at is not None:  # a queued request went ACTIVE: its node counts from then
            waited = time.time() - progress.started_at
        _say_queued(group, before)
    except BackendError as exc:
        if not exc.transient:
            failure, reason = str(exc), exc.reason
        elif waited <= limit or queued:
            # The API did not answer this time; that says nothing about the slice.
            log.info("%s %s: poll failed, will look again: %s", group_noun(group), group.name, exc)
            return GroupStatus.PROVISIONING
        else:
            failure = f"not READY within {limit:.0f}s (last poll: {exc})"
    if records:
        apply_ready(group, records, lease)
        return GroupStatus.ACTIVE
    if failure or (waited > limit and not queued):
        why = failure or f"not READY within {limit:.0f}s"
        log.warning("deleting %s %s: %s", group_noun(group), group.name, why)
        _fail_pod(group, why, reason or JobReason.WAITING_INSTANCE_LIMIT_EXCEEDED, lease)
        return GroupStatus.TERMINATING
    if (queued or group.backend_data.get(REPLICA_POD)) and not _awaited(group):
        # A request may wait at Google for hours; once no job waits for it (the run was stopped)
        # it is withdrawn rather than left to turn into a billed slice nobody asked for. A service
        # replica's slice is its replica's alone: one whose replica went (scaled down, stopped) is
        # deleted while still being made, not kept once up.
        _fail_pod(group, "no job waits for it any more", JobReason.TERMINATED_BY_SERVER, lease)
        return GroupStatus.TERMINATING
    return GroupStatus.PROVISIONING


def _awaited(group: InstanceGroup) -> bool:
    return Job.objects.filter(_WAITS, instance__group=group).exists()


# a job waiting for its host, or one that ended keeping it for its restart (a slice made again)
_WAITS = Q(status__in=_WAITING) | Q(keep_host=True, superseded=False)


def _waited_for_by(inst: Instance) -> int | None:
    """The project of the job that waits for the host (its holder once ready), or None."""
    return Job.objects.filter(_WAITS, instance=inst).values_list("run__project_id", flat=True).first()


def _say_queued(group: InstanceGroup, before: dict | None) -> None:
    # One event per change of the request's state (or zone), on the pod and on each waiting job.
    view = queued_view(group)
    if not view or not view["state"] or (before and (before["state"], before["zone"]) == (view["state"], view["zone"])):
        return
    text = f"queued resource in {view['zone']}: {view['state']}"
    # with the poll's give-back, which keeps the state they tell of
    outcome.learn(group, event=outcome.event(group.project_id, f"instance group {group.name}", text,
                                             status=GroupStatus.PROVISIONING))
    for job in Job.objects.filter(instance__group=group, status__in=_WAITING).select_related("run"):
        outcome.learn(group, event=outcome.event(job.run.project_id, f"job {job.run.name}/{job.job_num}", text,
                                                 status=job.status, run_id=job.run_id, job_id=job.pk))


def _fail_pod(group: InstanceGroup, why: str, reason: str, lease: Lease) -> None:
    """Delete a slice that will not become usable, and end the jobs that waited for it (the poll
    holding the pod sends its terminate_group once it gives the pod back)."""
    with transaction.atomic():
        # Every waiting job ends (none may fall back to creating another slice of its own).
        gangs = {}
        for job in Job.objects.filter(instance__group=group, status__in=_WAITING).select_related("run"):
            terminate_job(job, reason, f"{group_noun(group)} {group.name}: {why}")
            gangs[(job.run_id, job.submission_num)] = job
        for job in gangs.values():  # their runs' static hosts go back in this same step
            if is_service(job.run):
                continue  # a service's replicas are placed each on its own: no gang to let go
            gang.release(job.run, job.submission_num, job.node_group_name, f"{group_noun(group)} {group.name}: {why}")
        move_group(group, GroupStatus.TERMINATING, frm=NOT_TERMINATED_GROUP, message=f"deleting: {why}", lease=lease)
        move_instances(list(group.instances.exclude(status=InstanceStatus.TERMINATED)), InstanceStatus.TERMINATING,
                       frm=NOT_TERMINATED, message=f"deleting with its group: {why}", termination_reason=reason[:64])


def pods_to_poll(now):
    """Provisioning pods whose self-rescheduled poll looks lost (not looked at for a while)."""
    quiet = max(3 * poll_interval(), 3 * float(settings.MUSTER["SWEEP_INTERVAL"]))
    return InstanceGroup.objects.filter(unleased(now), kind=GroupKind.TPU_POD, status=GroupStatus.PROVISIONING,
                                        updated__lt=now - timedelta(seconds=quiet)).values_list("pk", flat=True)[:POD_BATCH]


def expire_idle_pods(now) -> int:
    """Delete pods idle longer than their fleet's idle_duration (None keeps them for reuse); a service
    replica's pod as soon as it is idle (its replica is gone)."""
    expired = 0
    policed = Q(fleet__idle_duration__isnull=False) | Q(**{f"backend_data__{REPLICA_POD}": True})
    for group in InstanceGroup.objects.filter(policed, kind=GroupKind.TPU_POD,
                                              status=GroupStatus.ACTIVE).select_related("fleet"):
        hosts = list(group.instances.all())
        if not hosts or any(h.status != InstanceStatus.IDLE for h in hosts):
            continue
        idle_since = max(h.idle_since or now for h in hosts)
        keep_for = 0 if group.backend_data.get(REPLICA_POD) else group.fleet.idle_duration
        if now - idle_since < timedelta(seconds=keep_for) or group_in_use(group):
            continue  # (a job still pointing at idle hosts is about to take them back)
        with transaction.atomic():
            # Take every host from idle in one conditional update, so a run reusing the pod at
            # this moment (the same update the other way) and the policy never both win.
            taken = move_instances(hosts, InstanceStatus.TERMINATING, frm=[InstanceStatus.IDLE],
                                   message="idle past its fleet's idle_duration", actor="idle policy",
                                   termination_reason=InstanceReason.IDLE)
            if len(taken) != len(hosts):
                transaction.set_rollback(True)
                continue
            if end_group(group, actor="idle policy"):
                messages.terminate_group(group.pk)
        expired += 1
    return expired
