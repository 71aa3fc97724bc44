"""Reclaim on a shared fleet (Kueue's reclaimWithinCohort): a waiting run whose project is owed hosts
stops preemptible runs of the projects that borrowed them.

Job 0's provisioning step (engine/submitted/provision.py), where it finds its shared fleet full and
is about to wait, asks `reclaim_for` before the priority preemption within its project
(engine/submitted/preemption.py). It reclaims when its project P is owed: what P holds on the fleet
plus the run's demand stays within P's nominal quota (instances/shares.owed), so the fleet is full
only because other projects hold more than theirs. A run is a candidate when it is a task of
another project that wrote `preemptible: true`, placed on the fleet and not being stopped already,
and its project holds more than its nominal quota. The choice is preemption's (`choose`: the
lowest priority first, the fewest runs, only the hosts that fit the waiting run), with a budget per
project: what it holds above its quota (instances/shares.lent), so no project is brought below its
quota; whole runs only, so a borrower whose smallest preemptible run is bigger than what it borrowed
keeps it. The stop is preemption's too (`stop_run`): one guarded write per victim, the stop signal
and its `stop_duration` as grace, `preempted`, an interruption its `retry` brings back.

Priority never crosses projects: a candidate's priority orders the victims, but the waiting run's
own priority plays no part here (a priority-100 run of a project at its quota reclaims nothing), and
the priority preemption stays within one project.

Tenant isolation: each event is written in its own project and names no run of the other. The
waiting run's says how many hosts it reclaims ("lent to other projects"); the stopped run's names
the reclaiming project only where its members may see that project anyway (either is the fleet's
owner: the owner sees every share, a project the fleet is shared with sees the owner), else
"another project sharing fleet ...".
"""

from __future__ import annotations

from django.db import transaction

from engine.submitted import preemption
from events.services import record
from instances import fitting, shares
from instances.models import Fleet
from runs.models import Job


def reclaim_for(job: Job, fleets: list[Fleet], siblings: list[Job] | None) -> str:
    """Stop preemptible runs of borrowing projects for the hosts job 0's run is owed, if any; returns
    what its wait adds ("" when nothing was stopped)."""
    fleet = preemption.sole_static(job, fleets)
    if fleet is None or getattr(fleet, "shared", True) is False:  # read knowing it is not shared: no query
        return ""
    found = shares.shares_of([fleet.pk]).get(fleet.pk)  # one query; a fleet not shared ends here
    run = job.run
    if not found or run.project_id not in found:
        return ""
    demands = fitting.group_demands(run, siblings)
    usage = shares.fresh_usage_of(fleet.pk)  # it stops other projects' runs: not a step's earlier read
    if not shares.owed(found[run.project_id], usage.get(run.project_id, {}), shares.demand_of(demands)):
        return ""
    room = {p: left for p, share in found.items() if p != run.project_id
            and (left := shares.lent(share, usage.get(p, {}))) is not None}
    if not room:
        return ""
    usable = preemption.usable_for(demands)
    held: dict[int, dict] = {}
    for run_id, name, priority, since, project_id, instance_id, resources, gpus in _candidate_jobs(fleet, room):
        seen = held.setdefault(run_id, {"row": (name, priority, since, project_id), "hosts": {}})
        seen["hosts"][instance_id] = (resources, gpus or 0)
    if not held:
        return ""
    candidates = [preemption.Candidate(run_id, *c["row"][:3], sum(1 for r, _ in c["hosts"].values() if usable(r)),
                            project_id=c["row"][3],
                            frees={"hosts": len(c["hosts"]), "gpus": sum(g for _, g in c["hosts"].values())})
                  for run_id, c in held.items()]
    chosen = preemption.choose([c for c in candidates if c.hosts], preemption.hosts_needed(fleet, demands, usable), room)
    reclaimer = found[run.project_id].project
    owner = found.get(fleet.project_id)
    taken = 0
    for c in chosen:
        with transaction.atomic():
            if preemption.stop_run(c.run_id, _victim_words(reclaimer, run.project_id, c.project_id, fleet, owner)) is not None:
                taken += c.hosts
    if not taken:
        return ""
    said = f"reclaims {taken} host{'s' if taken > 1 else ''} of fleet {_fleet_in(fleet, owner, run.project_id)} " \
           "lent to other projects: their preemptible runs get the stop signal"
    record(run.project_id, f"run {run.name}", said, status=run.status, run_id=run.pk)
    return f"; reclaiming {taken} host{'s' if taken > 1 else ''} lent to other projects"


def _candidate_jobs(fleet: Fleet, room: dict[int, dict]):
    runs = preemption.preemptible_runs(room)
    if not runs.exists():
        return []
    return (Job.objects.filter(instance__fleet=fleet, superseded=False, status__in=preemption.PLACED, run_id__in=runs)
            .values_list("run_id", "run__name", "run__priority", "run__submitted_at", "run__project_id",
                         "instance_id", "instance__resources", "instance__gpu_count"))


def _fleet_in(fleet: Fleet, owner: shares.Share | None, project_id: int) -> str:
    """The fleet as `project_id` names it: its own `name`, or `owner/name` shared with it."""
    return fleet.name if project_id == fleet.project_id else f"{owner.project if owner else ''}/{fleet.name}"


def _victim_words(reclaimer: str, reclaimer_id: int, victim_id: int, fleet: Fleet, owner: shares.Share | None) -> str:
    # the victim's project sees the reclaiming project's name only when one of the two owns the fleet
    who = f"project {reclaimer}" if fleet.project_id in (reclaimer_id, victim_id) \
        else "another project sharing the fleet"
    return (f"reclaimed by {who} (its quota on fleet {_fleet_in(fleet, owner, victim_id)}): "
            "its jobs get the stop signal and {grace}s to end")
