"""What the fleets page shows beside each fleet's hosts: the project's runs waiting for it, in queue
order (runs/queue.py), and what each project holds of it against its quota (instances/rows.held:
usage_by_project's read, for all the page's fleets at once; the quotas from instances/shares.py).

The page lists the project's own fleets and those other projects share with it (docs/queueing.md,
"Shared fleets"). Only the caller's project's runs are named: the queue is read for that project
alone, and the usage of a fleet is counts per project, never runs. On a fleet shared with it, the
project sees its own share only, as the API's fleet list shows it."""

from __future__ import annotations

from console.words import seconds
from instances.rows import held
from instances.shares import NOUN, RESOURCES, shares_of
from projects.models import Project
from runs import queue


def quota_words(quota: dict | None) -> str:
    """"2 hosts, 8 GPUs"; "-" for a project without a share (a fleet not shared) or without a quota."""
    said = [f"{quota[r]} {NOUN[r]}" for r in RESOURCES if quota and quota.get(r) is not None]
    return ", ".join(said) or "-"


def asked(project: Project, fleet, own_names: set[str]) -> queue.Asked:
    """The fleet as runs/queue.waits_for tells a run waiting for it."""
    owner = getattr(fleet, "shared_from", None)
    if owner is None:
        return queue.Asked(fleet.pk, fleet.name, fleet.name, False)
    return queue.Asked(fleet.pk, fleet.name, f"{owner}/{fleet.name}", True, ambiguous=fleet.name in own_names)


def fleet_views(project: Project, fleets: list) -> dict[int, dict]:
    """{fleet id: {"queue": [row], "usage": [row]}} for the page's `fleets` (another project's carries
    `shared_from`, its owner's name): the project's queue read once (a host given back wakes the
    project's waiting runs in one order, so the places are the project's, as `muster queue --fleet`
    shows them), split by the fleet each run waits for."""
    waiting = queue.queue(project)
    for row in waiting:
        row["waited"] = seconds(row["wait_seconds"])
    # what each project holds of these fleets and its quota there, one read each for them all
    holdings = held([fleet.pk for fleet in fleets])
    quotas = shares_of(fleet.pk for fleet in fleets)
    others = ({pk for _, pk in holdings} | {pk for s in quotas.values() for pk in s}) - {project.pk}
    names = {project.pk: project.name,
             **(dict(Project.objects.filter(pk__in=others).values_list("pk", "name")) if others else {})}
    own_names = {fleet.name for fleet in fleets if getattr(fleet, "shared_from", None) is None}
    answer = {}
    for fleet in fleets:
        shares = quotas.get(fleet.pk, {})
        used = {pk: counts for (fleet_id, pk), counts in holdings.items() if fleet_id == fleet.pk}
        for pk in shares:  # each sharing project, even one holding nothing now
            used.setdefault(pk, (0, 0))
        used.setdefault(project.pk, (0, 0))  # the caller's row, even when it holds nothing
        if getattr(fleet, "shared_from", None) is not None:
            used = {project.pk: used[project.pk]}  # another's fleet: the caller's own share only
        usage = [{"project": names.get(pk, "?"), "hosts": hosts, "gpus": gpus, "mine": pk == project.pk,
                  "quota": quota_words(shares[pk].quota if pk in shares else None)}
                 for pk, (hosts, gpus) in used.items()]
        which = asked(project, fleet, own_names)
        answer[fleet.pk] = {
            "queue": [row for row in waiting if queue.waits_for(row, which)],
            "usage": sorted(usage, key=lambda u: (not u["mine"], u["project"])),
            "shared": bool(shares),
        }
    return answer
