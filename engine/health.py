"""Reachability of hosts, as the engine observes it while talking to their runners."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from backends.base import BackendError
from backends.registry import compute_for_instance
from engine import log_copy, runner_status
from events.services import record
from instances.models import Instance, InstanceCondition
from runs.choices import JOB_FINISHED, RUNNER_LIVE
from runs.models import Job

log = logging.getLogger(__name__)


def mark_unreachable(instance: Instance, why: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        if Instance.objects.filter(pk=instance.pk, unreachable=False).update(unreachable=True, unreachable_since=now):
            record(instance.project_id, f"instance {instance.name}", f"unreachable: {why}", status=InstanceCondition.UNREACHABLE,
                   instance_id=instance.pk)
            instance.unreachable, instance.unreachable_since = True, now


def mark_reachable(instance: Instance, seen: set[int] | None = None) -> None:
    """`instance` was read a moment ago (with its job): a reachable host costs a write only when its
    `last_seen` is older than 10 s. `seen`: a batch's hosts whose `last_seen` is due go in it, to
    be written together by `record_seen` (the watch of a thousand running jobs wrote a hundred
    single-row UPDATEs a second otherwise)."""
    now = timezone.now()
    if instance.unreachable:
        if not stop_orphans(instance):
            return  # stays unreachable, so placement skips it; the next look tries again
        with transaction.atomic():
            if Instance.objects.filter(pk=instance.pk, unreachable=True).update(
                    unreachable=False, unreachable_since=None, last_seen=now):
                record(instance.project_id, f"instance {instance.name}", "reachable again", status=instance.status,
                       instance_id=instance.pk)
        instance.unreachable, instance.unreachable_since, instance.last_seen = False, None, now
        return
    if not instance.last_seen or (now - instance.last_seen).total_seconds() > 10:
        instance.last_seen = now
        if seen is not None:
            seen.add(instance.pk)
            return
        Instance.objects.filter(pk=instance.pk).update(last_seen=now)


def record_seen(instance_ids: set[int]) -> None:
    """The batch's hosts found reachable whose `last_seen` was due (`mark_reachable`), in one UPDATE."""
    if instance_ids:
        Instance.objects.filter(pk__in=instance_ids).update(last_seen=timezone.now())


def stop_orphans(instance: Instance) -> bool:
    """Stop and clean up, on a host that answers again, the jobs the server ended while it could
    not reach it (instance_unreachable, or a stop it could not deliver). Their processes may
    still run there: offered again, the host would get a new job next to them (its ports taken,
    or a runner job id that already exists). True once none of them is left running.
    """
    since = instance.unreachable_since
    if since is None:
        return True
    ended = list(Job.objects.filter(instance_id=instance.pk, runner_submitted=True, status__in=JOB_FINISHED,
                                    status_changed_at__gte=since).select_related("run"))
    if not ended:
        return True
    host = compute_for_instance(instance).runner_host(instance)
    stopping, cleaned = [], []
    try:
        known = runner_status.read(host)["jobs"]
        for job in ended:
            state = (known.get(job.runner_job_id) or {}).get("state")
            if state is None:
                continue  # already cleaned up (or never reached the runner)
            if state in RUNNER_LIVE:
                host.stop(job.runner_job_id)
                stopping.append(job)
                continue
            log_copy.keep_copy(job, host)  # the log the server could not copy when the job ended
            host.cleanup(job.runner_job_id)
            cleaned.append(job)
    except BackendError as exc:
        log.info("could not clean up ended jobs on %s: %s", instance.name, exc)
        return False
    finally:
        host.close()
    for job in stopping:
        record(instance.project_id, f"instance {instance.name}",
               f"stopping job {job.run.name}/{job.job_num}, ended while the host was unreachable",
               status=InstanceCondition.UNREACHABLE, instance_id=instance.pk, job_id=job.pk)
    for job in cleaned:
        record(instance.project_id, f"instance {instance.name}",
               f"cleaned up job {job.run.name}/{job.job_num}, ended while the host was unreachable",
               status=InstanceCondition.UNREACHABLE, instance_id=instance.pk, job_id=job.pk)
    return not stopping
