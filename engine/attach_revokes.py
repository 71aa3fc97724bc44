"""Removing attach lines from hosts (runs/services/attach.py installs them): in the step that ends
a job, and for grants due otherwise (a user lost access) one host per step.

The rows are claimed, so two workers never edit one host's authorized_keys for the same grants;
a host that does not answer backs the rows off, and the sweep sends the step again once the host's
health check has it reachable (engine/sweeps.py).
"""

from __future__ import annotations

import logging
from functools import partial

from backends.registry import attach_keys as attach_keys_module
from backends.registry import compute_for_instance
from engine import claims
from engine.tuning import REVOKE_BATCH as BATCH
from instances.models import Instance
from muster.claimable import leased
from runs.models import AttachGrant, Job

log = logging.getLogger(__name__)

attach_keys = attach_keys_module()  # the SSH hosts' authorized_keys lines


def remove_grants(host, grants: list[AttachGrant], token: str | None = None) -> None:
    """Take the grants' lines off their host, then their rows (a failure leaves both for a retry).
    `token`: the rows' lease; only those it still holds are deleted (a worker whose lease was taken
    over leaves the rows to their new holder; removing a line twice is harmless, a row is not)."""
    if grants:
        attach_keys.remove(host, attach_keys.authorized_keys_path(), [g.needle for g in grants])
        rows = AttachGrant.objects.filter(pk__in=[g.pk for g in grants])
        (rows if token is None else leased(rows, token)).delete()


def end_job_grants(job: Job) -> int:
    """The job is ending: its lines are due to go (engine/finishing.py removes them while it talks
    to the host; the sweep does if the host does not answer). Returns how many the job has."""
    return AttachGrant.objects.filter(job=job).update(revoke_due=True)


def end_grants_of(job_ids: list[int]) -> dict[int, int]:
    """end_job_grants for several ending jobs: {job id: its grants}, only those that have any. One
    read when none has (most jobs are never attached to), the UPDATE only for those that have."""
    counts: dict[int, int] = {}
    for job_id in AttachGrant.objects.filter(job_id__in=job_ids).values_list("job_id", flat=True):
        counts[job_id] = counts.get(job_id, 0) + 1
    if counts:
        AttachGrant.objects.filter(job_id__in=list(counts)).update(revoke_due=True)
    return counts


def revoke(job: Job, host, due: int | None = None) -> None:
    """Remove the attach lines of `job` from its host, in the step that ends the job.

    `due`: what end_job_grants returned earlier in the same step. A terminating job gets no new
    grant (grant() locks the job and wants it attachable), so neither the mark nor, for a job that
    has none (most), the read is done again."""
    if due is None:
        due = end_job_grants(job)
    if not due:
        return
    grants = list(AttachGrant.objects.filter(job=job, revoke_due=True))
    if grants:
        remove_grants(host, grants)
        log.info("attach keys of %s removed from %s", job, job.instance.name)


def revoke_attach_keys(instance_id: int) -> int:
    due = AttachGrant.objects.filter(instance_id=instance_id, revoke_due=True)
    return len(claims.claimed_batch(due, BATCH, "revoke_attach_keys", partial(_revoke, instance_id)).pks)


def _revoke(instance_id: int, held: claims.Held) -> dict:
    instance = Instance.objects.select_related("fleet").get(pk=instance_id)
    host = compute_for_instance(instance).runner_host(instance)
    try:
        remove_grants(host, list(held.rows(AttachGrant.objects.all())), held.token)
    finally:
        host.close()
    return {}  # the rows are gone with their lines: nothing is left to give back


def instances_with_due_revokes(now):
    """Reachable hosts with lines due to go that nobody is removing (for the sweep)."""
    return (AttachGrant.objects.filter(claims.unleased(now), revoke_due=True, instance__unreachable=False)
            .values_list("instance_id", flat=True).distinct()[:BATCH])
