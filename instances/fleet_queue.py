"""A fleet's admission row (FleetQueue, claimed by engine/admission.py) and what its look reads of
the fleet: made when first needed, counted up by each release, and the fleet's idle hosts."""

from __future__ import annotations

from itertools import islice

from django.db.models import F

from instances.fitting import candidates, page_for
from instances.models import Fleet, FleetQueue, FleetStatus, Instance, InstanceStatus
from instances.rows import count_release, free_instances
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
    """One more release on each fleet (its row made if missing): the ids whose look should be sent.

    Only the first release since the last look sends one (the count one past what that look
    started from), and only while no look holds the row: the releases after it, until that look
    has read the row, are looked at by it, and those while a look holds the row by the look it
    sends itself once it sees the count moved. So a burst of releases costs a few looks, each
    placing many runs, not a look per release, each reading the queue for one host. A lost look is
    the sweep's: the count stays past `admitted`.
    """
    ids = sorted(set(fleet_ids))
    if not ids:
        return []
    counted = count_release(ids)
    missing = set(ids) - set(counted)
    if missing:
        live = Fleet.objects.filter(pk__in=missing).values_list("pk", flat=True)
        FleetQueue.objects.bulk_create([FleetQueue(fleet_id=pk) for pk in live], ignore_conflicts=True)
        counted.update(count_release(sorted(missing)))  # made now, by this release or by another step
    first = [pk for pk, (wanted, admitted) in sorted(counted.items()) if wanted == admitted + 1]
    # a look that holds the row now started before this release: it sends itself again once done
    return list(FleetQueue.objects.filter(unleased(), pk__in=first).values_list("pk", flat=True)) if first else []


def unlooked(fleet_id: int) -> bool:
    """Whether nobody holds the fleet's row while a release on it waits for a look."""
    return FleetQueue.objects.filter(unleased(), pk=fleet_id, wanted__gt=F("admitted")).exists()


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
