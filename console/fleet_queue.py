"""What the fleets page shows beside each fleet's hosts: the project's runs waiting for it, in queue
order (runs/queue.py), and what each project holds of it (instances/rows.held: usage_by_project's
read, for all the page's fleets at once).

Only the caller's project's runs are named: the queue is read for that project alone, and the usage
of a fleet is counts per project, never runs."""

from __future__ import annotations

from console.words import seconds
from instances.rows import held
from projects.models import Project
from runs import queue


def fleet_views(project: Project, fleets: list) -> dict[int, dict]:
    """{fleet id: {"queue": [row], "usage": [row]}} for the project's `fleets`: the project's queue
    read once (a host given back wakes the project's waiting runs in one order, so the places are the
    project's, as `muster queue --fleet` shows them), split by the fleet each run waits for."""
    waiting = queue.queue(project)
    for row in waiting:
        row["waited"] = seconds(row["wait_seconds"])
    # what each project holds of these fleets, one read for them all
    holdings = held([fleet.pk for fleet in fleets])
    others = {pk for _, pk in holdings if pk != project.pk}  # a shared fleet's other projects: names and counts only
    names = {project.pk: project.name,
             **(dict(Project.objects.filter(pk__in=others).values_list("pk", "name")) if others else {})}
    answer = {}
    for fleet in fleets:
        used = {pk: counts for (fleet_id, pk), counts in holdings.items() if fleet_id == fleet.pk}
        used.setdefault(project.pk, (0, 0))  # the caller's row, even when it holds nothing
        usage = [{"project": names.get(pk, "?"), "hosts": hosts, "gpus": gpus, "mine": pk == project.pk}
                 for pk, (hosts, gpus) in used.items()]
        answer[fleet.pk] = {
            "queue": [row for row in waiting if queue.waits_on(row["reason"], fleet.name)],
            "usage": sorted(usage, key=lambda u: (not u["mine"], u["project"])),
        }
    return answer
