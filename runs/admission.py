"""Which waiting runs the idle hosts of a fleet go to: the choice of engine/admission.py's look.

Read in the queue's order (runs/queue.py), as far as the idle hosts and the look's promises need:
each waiting job's demand is the hosts its run (its replica, for a service) still needs; the first
ones whose demand fits what is left are woken (BestEffortFIFO, Kueue's default queueing strategy:
one too big for what is idle now is passed over and keeps its place). A job a recent look woke is
not woken again: while its promise lasts its hosts count as taken; after, it is passed over until
its own recheck (it was woken and did not fit).
"""

from __future__ import annotations

from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.utils import timezone

from muster.claimable import unleased
from runs import queue
from runs.choices import JobStatus
from runs.models import Job


def _demand():
    """The hosts a waiting job's run (its replica) still needs: its jobs of the same submission without one."""
    needing = (Job.objects.filter(run_id=OuterRef("run_id"), replica_num=OuterRef("replica_num"), superseded=False,
                                  status=JobStatus.SUBMITTED, instance__isnull=True)
               .order_by().values("run_id").annotate(n=Count("pk")).values("n"))
    return Subquery(needing, output_field=IntegerField())


def waiting_heads(fleet, limit: int):
    """(job id, demand) of the jobs waiting for `fleet`, in queue order, at most `limit`."""
    rows = (queue.waiting_jobs(fleet.project_id).filter(unleased(timezone.now()))
            .annotate(demand=_demand()).values_list("pk", "demand", "waiting_for")[:limit])
    return [(pk, max(1, demand or 1)) for pk, demand, why in rows if queue.waits_on(why, fleet.name)]


def still_waiting(job_ids) -> list[int]:
    """Those of `job_ids` still waiting for a host (a look's promises to the others are kept)."""
    if not job_ids:
        return []
    return list(Job.objects.filter(pk__in=list(job_ids), status=JobStatus.SUBMITTED,
                                   waiting_for__startswith=queue.PREFIX).values_list("pk", flat=True))


def choose(fleet, idle: int, live: set[int], passed: set[int], margin: int) -> list[int]:
    """The jobs to wake for `idle` hosts of `fleet`. `live`: jobs a look woke whose promise lasts
    (their hosts count as taken); `passed`: jobs woken before that still wait (they did not fit);
    `margin`: how many more waiting jobs to read than one per idle host and per promise."""
    heads = waiting_heads(fleet, idle + len(live) + len(passed) + margin)
    free = idle - sum(d for pk, d in heads if pk in live)
    picks = []
    for pk, demand in heads:
        if free <= 0:
            break
        if pk in live or pk in passed or demand > free:
            continue
        picks.append(pk)
        free -= demand
    return picks
