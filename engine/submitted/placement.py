"""Taking hosts: the instances each job of a run takes, in locked UPDATEs. Which fleet fits, and
which of its hosts could, are the read-only questions of instances/fitting.py."""

from __future__ import annotations

from itertools import islice

from django.db import connection, transaction
from django.db.models import Exists, OuterRef

from instances import shares
from instances.fitting import candidates, page_for
from instances.models import Fleet, FleetShare, Instance, InstanceStatus
from instances.transitions import take_idle


def take_instances(fleet: Fleet, req: dict, count: int, project_id: int) -> list[Instance]:
    """Claim `count` idle instances that fit `req` for a job of project `project_id` (their holder)
    in one transaction, or none at all.

    A group master takes its whole group this way, so a run never holds part of a group while it
    waits for the rest. The scan is not locked (rows another worker rejects stay visible to us);
    only the picks are, with SKIP LOCKED on PostgreSQL, so concurrent takers skip each other's
    picks and look further instead of waiting. SQLite's IMMEDIATE transaction serialises takers.
    """
    skip_locked = connection.features.has_select_for_update_skip_locked
    taken: list[Instance] = []
    with transaction.atomic():
        found = candidates(fleet, req, page_for(count))
        while len(taken) < count:
            chunk = {inst.pk: inst for inst in islice(found, count - len(taken))}
            if not chunk:
                transaction.set_rollback(True)  # short of the whole group: give back what we took
                return []
            if skip_locked:  # the picks still idle that nobody else is taking right now
                locked = set(Instance.objects.filter(pk__in=chunk, status=InstanceStatus.IDLE)
                             .select_for_update(skip_locked=True).values_list("pk", flat=True))
                chunk = {pk: inst for pk, inst in chunk.items() if pk in locked}
            # rows as `candidates` loaded them (name, address, resources), busy from here on
            if not take_idle(list(chunk.values()), project_id):  # cannot happen with the picks locked; never guess
                transaction.set_rollback(True)
                return []
            taken.extend(chunk.values())
    return taken


GangGroup = tuple[int, str, dict, int]  # (group index, name, requirements, node count)


def take_gang_across(groups: list[tuple[Fleet, GangGroup]], project_id: int,
                     ) -> tuple[dict[int, list[Instance]], list[str]]:
    """Take hosts for every static group of a run in one transaction, or none at all; the groups
    may be on different fleets (a run that spans fleets).

    Returns ({group index: instances}, []) or ({}, one line per group that came up short).
    Gang takers lock the rows of the fleets they take from first, always in the order of their
    ids, so two runs racing for the same hosts go one after the other: the first takes all it
    needs, the second sees what is left. Neither can hold part of the hosts while waiting for the
    rest, and with the locks taken in one order there is no deadlock. FOR NO KEY UPDATE: a
    transaction placing a run on the fleet holds a KEY SHARE on its row (the run's foreign key),
    which this lock need not wait for. Groups that ask for GPUs go first, so a CPU group never
    takes the GPU host a later group needed.

    A shared fleet (instances/shares.py) also asks, under the same lock, whether `project_id` may
    hold what the run took of it: over its quota plus what it may borrow, nothing is taken and the
    one line says so (it starts `quota:`), so two projects racing for its last host go one by one.
    """
    order = sorted(groups, key=lambda fg: (not (fg[1][2].get("gpu") or {}), fg[1][0]))
    taken: dict[int, list[Instance]] = {}
    short: list[str] = []
    with transaction.atomic():
        # the lock's statement also says which fleets are shared (instances/shares.py asks only of those)
        shared = {pk for pk, has in Fleet.objects.select_for_update(no_key=True).filter(
            pk__in={f.pk for f, _ in groups}).order_by("pk").annotate(
            has=Exists(FleetShare.objects.filter(fleet=OuterRef("pk")))).values_list("pk", "has") if has}
        for fleet, (index, name, req, count) in order:
            got = take_instances(fleet, req, count, project_id)
            if got:
                taken[index] = got
                continue
            left = sum(1 for _ in islice(candidates(fleet, req, page_for(count)), count))
            before = [g[1] for f, g in order if g[0] in taken and f.pk == fleet.pk]
            after = f" once {', '.join(before)} took theirs" if before else ""
            short.append(f"{name}: needs {count} idle hosts of fleet {fleet.name}, {left} left{after}")
        if not short and shared:
            by_fleet: dict[int, tuple[Fleet, list[Instance]]] = {}
            for fleet, (index, _, _, _) in order:
                if fleet.pk in shared:
                    by_fleet.setdefault(fleet.pk, (fleet, []))[1].extend(taken[index])
            short = [why for fleet, got in by_fleet.values() if (why := shares.within(fleet, project_id, got))][:1]
            if not short:
                for fleet, got in by_fleet.values():  # the step's next choices count them
                    shares.took(fleet.pk, project_id, got)
        if short:
            transaction.set_rollback(True)  # nothing of the run stays taken
            return {}, short
    return taken, []


def take_group(fleet: Fleet, group: GangGroup, project_id: int) -> tuple[list[Instance], str]:
    """take_gang_across for one group on one fleet (a service's replica, a group placed again): its
    hosts, or none and the quota's refusal when a shared fleet's quota said no ("" when the fleet
    was only short of idle hosts: the caller words that itself)."""
    got, short = take_gang_across([(fleet, group)], project_id=project_id)
    if got:
        return got[group[0]], ""
    return [], next((line for line in short if isinstance(line, shares.Refusal)), "")
