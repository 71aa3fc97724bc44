"""A fleet's admission row (FleetQueue, claimed by engine/admission.py) and what its look reads of
the fleet: made when first needed, counted up by each release, and the fleet's idle hosts."""

from __future__ import annotations

from django.db.models import F

from instances.models import Fleet, FleetQueue, FleetStatus, Instance, InstanceStatus
from instances.rows import free_instances


def ensure(fleet_id: int) -> bool:
    """The active fleet's row, made if it has none yet; False when there is no such active fleet."""
    if FleetQueue.objects.filter(pk=fleet_id, fleet__status=FleetStatus.ACTIVE).exists():
        return True
    if not Fleet.objects.filter(pk=fleet_id, status=FleetStatus.ACTIVE).exists():
        return False
    FleetQueue.objects.bulk_create([FleetQueue(fleet_id=fleet_id)], ignore_conflicts=True)
    return True


def want(fleet_ids) -> list[int]:
    """One more release on each fleet (its row made if missing): the ids whose rows now count it."""
    ids = sorted(set(fleet_ids))
    if not ids:
        return []
    if FleetQueue.objects.filter(pk__in=ids).update(wanted=F("wanted") + 1) < len(ids):
        have = set(FleetQueue.objects.filter(pk__in=ids).values_list("pk", flat=True))
        live = Fleet.objects.filter(pk__in=set(ids) - have).values_list("pk", flat=True)
        FleetQueue.objects.bulk_create([FleetQueue(fleet_id=pk, wanted=1) for pk in live], ignore_conflicts=True)
    return ids


def fleets_of(instance_ids) -> list[int]:
    """The fleets the given hosts belong to (a release's hosts are usually of one)."""
    return list(Instance.objects.filter(pk__in=instance_ids, fleet__isnull=False)
                .values_list("fleet_id", flat=True).distinct())


def idle_hosts(fleet: Fleet) -> int:
    """How many of the fleet's hosts a run could take now (placement's candidates, any resources)."""
    return free_instances(fleet).filter(status=InstanceStatus.IDLE).count()
