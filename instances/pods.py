"""TPU pod slices as instance groups: reserve (reuse or create), poll until READY, expire when idle.

A slice of H hosts is one InstanceGroup of kind `tpu_pod` named after the TPU node, with one
Instance per host whose `index` is the TPU worker id. Rows exist before the backend is asked to
create anything, so a crash between the two is found by the poll sweep, never leaked.
"""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backends.base import BackendError, Compute, NoCapacityError
from backends.registry import fleet_backend_config, get_compute
from backends.tpu_shapes import parse_slice
from events.services import record
from instances.models import Fleet, GroupKind, GroupStatus, Instance, InstanceGroup, InstanceStatus
from muster import claims, crypto
from muster.claims import unleased

log = logging.getLogger(__name__)


def _slice_of(job) -> str | None:
    gpu = job.spec["resources"].get("gpu") or {}
    return gpu.get("tpu")


def reserve_pod(fleet: Fleet, compute: Compute, group_jobs: list) -> dict[int, int]:
    """Give job k of the group host k of one pod: an idle pod of the same shape, else a new one."""
    shape = parse_slice(_slice_of(group_jobs[0]) or "")
    if shape is None or len(group_jobs) != shape.hosts:
        return {}
    jobs = sorted(group_jobs, key=lambda j: j.node_group_rank)
    reused = _reuse_idle_pod(fleet, shape.name, len(jobs))
    if reused is not None:
        return {job.pk: inst.pk for job, inst in zip(jobs, reused, strict=True)}
    offers = compute.get_offers(jobs[0].spec["resources"])
    if not offers:
        return {}
    group, instances = _plan_pod(fleet, shape, jobs[0])
    try:
        records = compute.create_instances(offers[0], shape.hosts, [group.name])
    except NoCapacityError:
        _forget(group, "no capacity in any zone")
        raise
    except BackendError:
        _forget(group, "create failed")
        raise
    if records:
        apply_ready(group, records)
    return {job.pk: inst.pk for job, inst in zip(jobs, instances, strict=True)}


def _reuse_idle_pod(fleet: Fleet, shape: str, hosts: int) -> list[Instance] | None:
    for group in InstanceGroup.objects.filter(fleet=fleet, kind=GroupKind.TPU_POD, shape=shape,
                                              status=GroupStatus.ACTIVE):
        with transaction.atomic():
            touched = Instance.objects.filter(group=group, status=InstanceStatus.IDLE).update(
                status=InstanceStatus.BUSY, idle_since=None)
            if touched == hosts:
                record(fleet.project_id, f"instance group {group.name}", "reused by a new run", status="busy")
                return list(group.instances.order_by("index"))
            transaction.set_rollback(True)  # a partly busy pod is not ours to take
    return None


def _plan_pod(fleet: Fleet, shape, master_job) -> tuple[InstanceGroup, list[Instance]]:
    base = f"{master_job.run.name}-{master_job.node_group_name}"[:50].rstrip("-")
    name = f"{base}-{secrets.token_hex(3)}"
    with transaction.atomic():
        group = InstanceGroup.objects.create(
            project=fleet.project, fleet=fleet, name=name, kind=GroupKind.TPU_POD, shape=shape.name,
            status=GroupStatus.PROVISIONING, backend_data={"backend": fleet.backend},
        )
        instances = [
            Instance.objects.create(
                project=fleet.project, fleet=fleet, group=group, index=k, name=f"{name}-{k}",
                status=InstanceStatus.PROVISIONING, backend=fleet.backend, username=_ssh_user(fleet),
            )
            for k in range(shape.hosts)
        ]
        record(fleet.project_id, f"instance group {name}", f"creating a {shape.name} slice ({shape.hosts} hosts)",
               status="provisioning")
    return group, instances


def _ssh_user(fleet: Fleet) -> str:
    return fleet_backend_config(fleet).get("ssh_user", "root")


def _forget(group: InstanceGroup, why: str) -> None:
    with transaction.atomic():
        group.instances.update(status=InstanceStatus.TERMINATED)
        InstanceGroup.objects.filter(pk=group.pk).update(status=GroupStatus.TERMINATED)
        record(group.project_id, f"instance group {group.name}", f"not created: {why}", status="terminated")


def apply_ready(group: InstanceGroup, records) -> None:
    """The slice is READY: fill in each host (worker k -> instance k) and hand it to its job."""
    from runs.models import Job

    config = fleet_backend_config(group.fleet) if group.fleet else {}
    key = config.get("ssh_private_key", "")
    with transaction.atomic():
        for rec in records:
            inst = group.instances.get(index=rec.worker_index)
            assigned = Job.objects.filter(instance=inst, status__in=["submitted", "provisioning"]).exists()
            Instance.objects.filter(pk=inst.pk, status=InstanceStatus.PROVISIONING).update(
                hostname=rec.hostname, internal_ip=rec.internal_ip, port=rec.port or 22, region=rec.region,
                resources=rec.resources or {}, backend_data=rec.backend_data,
                private_key_encrypted=crypto.encrypt(key) if key else "",
                status=InstanceStatus.BUSY if assigned else InstanceStatus.IDLE,
                idle_since=None if assigned else timezone.now(),
            )
        InstanceGroup.objects.filter(pk=group.pk).update(status=GroupStatus.ACTIVE,
                                                         backend_data={**group.backend_data, **records[0].backend_data})
        record(group.project_id, f"instance group {group.name}", f"ready with {len(records)} hosts", status="active")


def poll_pod(group_id: int) -> bool:
    """Task body: look at a slice being created; READY fills the hosts, stuck or failed deletes it."""
    token = claims.claim(InstanceGroup, group_id, status=GroupStatus.PROVISIONING)
    if token is None:
        return False
    group = InstanceGroup.objects.select_related("fleet").get(pk=group_id)
    compute = get_compute(group.backend_data.get("backend", "gcp"), fleet_backend_config(group.fleet))
    limit = float(settings.MUSTER["WAITING_INSTANCE_LIMIT"])
    try:
        records = compute.update_provisioning_data(group.name, group.backend_data)
    except BackendError as exc:
        records, failure = None, str(exc)
    else:
        failure = ""
    if records:
        apply_ready(group, records)
    elif failure or (timezone.now() - group.created).total_seconds() > limit:
        why = failure or f"not READY within {limit:.0f}s"
        log.warning("deleting TPU slice %s: %s", group.name, why)
        _fail_pod(group, why)
    claims.release(InstanceGroup, group_id, token)
    return True


def _fail_pod(group: InstanceGroup, why: str) -> None:
    """Delete a slice that will not become usable, and end the jobs that waited for it."""
    from runs.choices import JobReason
    from runs.models import Job
    from runs.transitions import terminate_job

    with transaction.atomic():
        for job in Job.objects.filter(instance__group=group, status__in=["submitted", "provisioning"]).select_related("run"):
            if job.status == "submitted":
                Job.objects.filter(pk=job.pk).update(instance=None)
            else:
                terminate_job(job, JobReason.WAITING_INSTANCE_LIMIT_EXCEEDED, f"TPU slice {group.name}: {why}")
        InstanceGroup.objects.filter(pk=group.pk).update(status=GroupStatus.TERMINATING)
        group.instances.exclude(status=InstanceStatus.TERMINATED).update(status=InstanceStatus.TERMINATING)
        record(group.project_id, f"instance group {group.name}", f"deleting: {why}", status="terminating")
        from instances import tasks

        transaction.on_commit(lambda: tasks.terminate_group.delay(group.pk))


def pods_to_poll(now):
    return InstanceGroup.objects.filter(unleased(now), kind=GroupKind.TPU_POD,
                                        status=GroupStatus.PROVISIONING).values_list("pk", flat=True)[:200]


def expire_idle_pods(now) -> int:
    """Delete pods idle longer than their fleet's idle_duration (None keeps them for reuse)."""
    from instances.lifecycle import delete_group

    expired = 0
    for group in InstanceGroup.objects.filter(kind=GroupKind.TPU_POD, status=GroupStatus.ACTIVE,
                                              fleet__idle_duration__isnull=False).select_related("fleet"):
        hosts = list(group.instances.all())
        if not hosts or any(h.status != InstanceStatus.IDLE for h in hosts):
            continue
        idle_since = max(h.idle_since or now for h in hosts)
        if now - idle_since >= timedelta(seconds=group.fleet.idle_duration):
            delete_group(group, actor="idle policy")
            expired += 1
    return expired
