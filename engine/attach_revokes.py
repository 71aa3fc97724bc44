"""Removing attach lines whose grants are due (runs/services/attach.py): one host per step.

The rows are claimed, so two workers never edit one host's authorized_keys for the same grants;
a host that does not answer backs the rows off, and the sweep sends the step again once the host's
health check has it reachable (engine/sweeps.py).
"""

from __future__ import annotations

from functools import partial

from backends.registry import compute_for_instance
from engine import claims
from engine.tuning import REVOKE_BATCH as BATCH
from instances.models import Instance
from runs.models import AttachGrant
from runs.services import attach


def revoke_attach_keys(instance_id: int) -> int:
    due = AttachGrant.objects.filter(instance_id=instance_id, revoke_due=True)
    return len(claims.claimed_batch(due, BATCH, "revoke_attach_keys", partial(_revoke, instance_id)).pks)


def _revoke(instance_id: int, held: claims.Held) -> dict:
    instance = Instance.objects.select_related("fleet").get(pk=instance_id)
    host = compute_for_instance(instance).runner_host(instance)
    try:
        attach.remove_grants(host, list(AttachGrant.objects.filter(pk__in=held.pks)))
    finally:
        host.close()
    return {}  # the rows are gone with their lines: nothing is left to give back


def instances_with_due_revokes(now):
    """Reachable hosts with lines due to go that nobody is removing (for the sweep)."""
    return (AttachGrant.objects.filter(claims.unleased(now), revoke_due=True, instance__unreachable=False)
            .values_list("instance_id", flat=True).distinct()[:BATCH])
