"""Reachability of hosts, as the engine observes it while talking to their runners."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from events.services import record
from instances.models import Instance


def mark_unreachable(instance: Instance, why: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        if Instance.objects.filter(pk=instance.pk, unreachable=False).update(unreachable=True, unreachable_since=now):
            record(instance.project_id, f"instance {instance.name}", f"unreachable: {why}", status="unreachable",
                   instance_id=instance.pk)
            instance.unreachable, instance.unreachable_since = True, now


def mark_reachable(instance: Instance) -> None:
    """`instance` was read a moment ago (with its job): a reachable host costs a write only when its
    `last_seen` is older than 10 s."""
    now = timezone.now()
    if instance.unreachable:
        with transaction.atomic():
            if Instance.objects.filter(pk=instance.pk, unreachable=True).update(
                    unreachable=False, unreachable_since=None, last_seen=now):
                record(instance.project_id, f"instance {instance.name}", "reachable again", status=instance.status,
                       instance_id=instance.pk)
        instance.unreachable, instance.unreachable_since, instance.last_seen = False, None, now
        return
    if not instance.last_seen or (now - instance.last_seen).total_seconds() > 10:
        Instance.objects.filter(pk=instance.pk).update(last_seen=now)
        instance.last_seen = now
