"""A fleet's admission row (FleetQueue, claimed by engine/admission.py) and what its look reads of
the fleet: made when first needed, counted up by each release, and the fleet's idle hosts."""

from __future__ import annotations

from itertools import islice

from django.db.models import F

from instances.fitting import candidates, page_for
from instances.models import Fleet, FleetQueue, FleetStatus, Instance, InstanceStatus
from instances.rows import free_instances
from muster.claimable import unleased


def ensure(fleet_id: int) -> bool:
    """The active fleet's row, made if it has none yet; False when there is no such active fleet."""
    if FleetQueue.objects.filter(pk=fleet_id, fleet__status=FleetStatus.ACTIVE).exists():
        return True
    if not Fleet.objects.filter(pk=fleet_id, status=FleetStatus.ACTIVE).exists():
        return False
    FleetQueue.objects.bulk_create([FleetQueue(fleet_id=fleet_id)], ignore_conflicts=True)
    return True


def want(fleet_ids) -> list[int]:
    """One more release on each fleet (its row made if missing): the ids whose look should be sent,
    those nobody holds now (a look that holds one sees the count moved once it is done, and is sent
    again then: a message now would only bounce off its lease)."""
    ids = sorted(set(fleet_ids))
    if not ids:
        return []
    if FleetQueue.objects.filter(pk__in=ids).update(wanted=F("wanted") + 1) < len(ids):
        have = set(FleetQueue.objects.filter(pk__in=ids).values_list("pk", flat=True))
        live = Fleet.objects.filter(pk__in=set(ids) - have).values_list("pk", flat=True)
        FleetQueue.objects.bulk_create([FleetQueue(fleet_id=pk, wanted=1) for pk in live], ignore_conflicts=True)
    return list(FleetQueue.objects.filter(unleased(), pk__in=ids).values_list("pk", flat=True))


def fleets_of(instance_ids) -> list[int]:
    """The fleets the given hosts belong to (a release's hosts are usually of one)."""
    return list(Instance.objects.filter(pk__in=instance_ids, fleet__isnull=False)
                .values_list("fleet_id", flat=True).distinct())


def fitting(fleet: Fleet, resources: dict, at_most: int) -> int:
    """How many of the fleet's idle hosts fit `resources`, counted up to `at_most` (placement's own read)."""
    return sum(1 for _ in islice(candidates(fleet, resources, page_for(at_most)), at_most))


def idle_hosts(fleet: Fleet) -> int:
    """How many of the fleet's hosts a run could take now (placement's candidates, any resources)."""
    return free_instances(fleet).filter(status=InstanceStatus.IDLE).count()
