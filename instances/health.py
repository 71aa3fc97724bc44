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
    now = timezone.now()
    with transaction.atomic():
        touched = Instance.objects.filter(pk=instance.pk, unreachable=True).update(
            unreachable=False, unreachable_since=None, last_seen=now)
        if touched:
            record(instance.project_id, f"instance {instance.name}", "reachable again", status=instance.status,
                   instance_id=instance.pk)
            instance.unreachable, instance.unreachable_since = False, None
        elif not instance.last_seen or (now - instance.last_seen).total_seconds() > 10:
            Instance.objects.filter(pk=instance.pk).update(last_seen=now)
