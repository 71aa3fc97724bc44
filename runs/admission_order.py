"""The admission look's order on a shared fleet: the runs waiting for it across every project
sharing it, the project furthest below its share first (instances/shares.fair_order: dominant
share over hosts and GPUs, Kueue's and DRF's rule), each project's own runs in its queue order
(runs/queue.py). Read by `Job.waiting_fleet`: one query per project sharing the fleet, each
reading at most `limit` heads, and one aggregate of what each project holds."""

from __future__ import annotations

from django.utils import timezone

from instances import shares
from muster.claimable import unleased
from runs import queue


def fair_heads(fleet, found: dict[int, shares.Share], limit: int, demand_of) -> list[tuple[int, int]]:
    """(job id, demand) of the jobs waiting for the shared `fleet`, in fair-share order, at most
    `limit`; `demand_of`: the expression of the hosts a job's run still needs (runs/admission.py's)."""
    now = timezone.now()
    heads: dict[int, list[shares.Head]] = {}
    demand: dict[int, int] = {}
    for project_id in found:
        rows = (queue.waiting_jobs(project_id).filter(unleased(now), waiting_fleet_id=fleet.pk)
                .annotate(demand=demand_of).values_list("pk", "demand", "run__priority", "run__submitted_at")[:limit])
        for pk, hosts, priority, since in rows:
            demand[pk] = max(1, hosts or 1)
            heads.setdefault(project_id, []).append((pk, {"hosts": demand[pk], "gpus": 0}, priority,
                                                     since.timestamp()))
    order = shares.fair_order(shares.usage_of(fleet.pk), {p: s.quota for p, s in found.items()}, heads, limit)
    return [(pk, demand[pk]) for pk in order]
