"""Preemption within a project's fleet: a waiting run of a higher priority that finds no idle host
stops preemptible runs of a lower priority to take their hosts.

Job 0's provisioning step (engine/submitted/provision.py), where it finds its fleet full and is about
to wait, asks `preempt_for`. A run is a candidate when it is a task of the same project that wrote
`preemptible: true`, has a lower `priority`, is placed (provisioning or running) with hosts on the
fleet the waiting run waits for, and is not being stopped already. Whole runs are stopped, never part
of a gang: each chosen run moves to `terminating` in one guarded write (from provisioning or running,
so a run already being stopped, by a user or by another preemption, is never chosen twice), and its
jobs end through the normal stop (runs.transitions.end_job, then finish_job): the stop signal, the
run's `stop_duration` as grace (runs/stop_grace.py), then `preempted`, an interruption that the
run's `retry` covers. The hosts go back to the queue as any others: to the highest priority first.

The choice is greedy (`choose`): the lowest priority first, within a priority the run that frees the
most hosts first (so the fewest runs), the newest submission first on a tie; then any chosen run
not needed after all (the highest priority first) is let off. Hosts idle or already on their way
back (jobs stopping on the fleet) count towards what the run needs, so a run that looks again during
its victims' grace does not stop more runs.

Priority never crosses projects: the candidates are the waiting run's own project's runs, on a
shared fleet too. Across projects the only preemption is a reclaim of hosts a project borrowed
beyond its quota (engine/submitted/reclaim.py, asked first), which reuses `choose` (with a budget
per project, `room`) and `stop_run`. A run waiting on several fleets at once (a run whose groups
span fleets) and a service do not preempt, and services are never preempted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from events.services import record
from instances import fitting
from instances.models import Fleet, Instance, InstanceStatus
from runs.choices import JOB_ACTIVE, JobReason, JobStatus, RunStatus
from runs.configuration import fits
from runs.models import Job, Run
from runs.stop_grace import stop_grace
from runs.transitions import move_run, terminate_job

PLACED = (JobStatus.PROVISIONING, JobStatus.PULLING, JobStatus.RUNNING)


@dataclass(frozen=True)
class Candidate:
    run_id: int
    name: str
    priority: int
    submitted_at: datetime
    hosts: int  # hosts of the fleet it holds that the waiting run could use
    project_id: int = 0
    frees: dict | None = None  # {"hosts", "gpus"} of the fleet it holds in all (a reclaim's budget counts them)


def choose(candidates: list[Candidate], need: int, room: dict[int, dict] | None = None) -> list[Candidate]:
    """The fewest and lowest-priority candidates whose hosts add up to `need`, or [] when all of them
    together do not (nothing is stopped for a run that would still not fit). `room` (a reclaim):
    {project id: what it may lose per resource}; a candidate whose `frees` would pass what its
    project has left of it is passed over (instances/shares.lent: never below its quota)."""
    if need <= 0:
        return []
    left = {p: dict(r) for p, r in (room or {}).items()}

    def affordable(c: Candidate) -> bool:
        if room is None:
            return True
        budget = left.get(c.project_id)
        return budget is not None and all((c.frees or {}).get(r, 0) <= v for r, v in budget.items())

    order = sorted(candidates, key=lambda c: (c.priority, -c.hosts, -c.submitted_at.timestamp(), -c.run_id))
    chosen, freed = [], 0
    for candidate in order:
        if freed >= need:
            break
        if not affordable(candidate):
            continue
        for r in left.get(candidate.project_id, {}):
            left[candidate.project_id][r] -= (candidate.frees or {}).get(r, 0)
        chosen.append(candidate)
        freed += candidate.hosts
    if freed < need:
        return []
    for candidate in sorted(chosen, key=lambda c: (-c.priority, c.hosts)):
        if freed - candidate.hosts >= need:  # a big run taken later covers this one's hosts
            chosen.remove(candidate)
            freed -= candidate.hosts
    return chosen


def preempt_for(job: Job, fleets: list[Fleet], siblings: list[Job] | None) -> str:
    """Stop the preemptible runs job 0's run needs the hosts of, if any; returns what its wait adds
    ("" when nothing was stopped)."""
    run = job.run
    fleet = sole_static(job, fleets)
    if fleet is None or run.priority <= 0:
        return ""
    demands = fitting.group_demands(run, siblings)
    usable = usable_for(demands)
    held: dict[int, list] = {}
    for row in _candidate_jobs(run, fleet):
        held.setdefault(row[0], []).append(row)
    if not held:
        return ""  # the common case, one query: nothing on the fleet may be preempted for this run
    need = hosts_needed(fleet, demands, usable)
    candidates = [Candidate(run_id, rows[0][1], rows[0][2], rows[0][3], sum(1 for r in rows if usable(r[4])))
                  for run_id, rows in held.items()]
    stopped = []
    for c in choose([c for c in candidates if c.hosts], need):
        said = (f"preempted by run {run.name} (priority {run.priority}), which needs hosts of fleet {fleet.name}: "
                "its jobs get the stop signal and {grace}s to end")
        with transaction.atomic():
            victim = stop_run(c.run_id, said)
            if victim is None:
                continue
            record(run.project_id, f"run {run.name}",
                   f"preempts run {victim.name} (priority {victim.priority}, preemptible) for {c.hosts} hosts of "
                   f"fleet {fleet.name}", status=run.status, run_id=run.pk)
        stopped.append(c)
    if not stopped:
        return ""
    names = ", ".join(f"{c.name} (priority {c.priority})" for c in stopped)
    return f"; stopping preemptible run{'s' if len(stopped) > 1 else ''} {names} for its hosts"


def sole_static(job: Job, fleets: list[Fleet]) -> Fleet | None:
    """The one static fleet job 0 waits for, when a preemption may be looked for on it."""
    if job.job_num != 0 or len({f.pk for f in fleets}) != 1 or not fitting.is_static(fleets[0]):
        return None
    return fleets[0]


def usable_for(demands: list[tuple[dict, int]]):
    """Whether a host's resources fit one of the waiting run's groups."""
    useful = [req for req, _ in demands]
    return lambda resources: any(fits(req, resources or {}) for req in useful)


def hosts_needed(fleet: Fleet, demands: list[tuple[dict, int]], usable) -> int:
    """The waiting run's nodes less the fleet's idle hosts that fit it and the hosts already on their
    way back (jobs stopping on the fleet, earlier victims included)."""
    idle = sum(1 for resources in Instance.objects.filter(fleet=fleet, status=InstanceStatus.IDLE, unreachable=False)
               .values_list("resources", flat=True) if usable(resources))
    coming = sum(1 for resources in Job.objects.filter(instance__fleet=fleet, status=JobStatus.TERMINATING,
                                                        keep_host=False).values_list("instance__resources", flat=True)
                 if usable(resources))
    return sum(count for _, count in demands) - idle - coming


def preemptible_runs(project_ids, below: int | None = None):
    """The placed preemptible tasks of `project_ids` not being stopped (of a priority below `below`):
    read from the runs' partial index `run_preemptible` first, so that a waiting run's look, where
    none exists (the common case), costs one short index read, not a join of every placed job of the
    fleet with its run's configuration (130 ms at 1,000 busy hosts without planner statistics:
    bench.queueing). A queryset of their ids, for `run_id__in` (a subquery, however many)."""
    found = Run.objects.filter(configuration__profile__preemptible=True, project_id__in=list(project_ids),
                               status__in=(RunStatus.PROVISIONING, RunStatus.RUNNING), stop_requested="",
                               configuration__type="task")
    if below is not None:
        found = found.filter(priority__lt=below)
    return found.values("pk")


def _candidate_jobs(run: Run, fleet: Fleet):
    runs = preemptible_runs([run.project_id], below=run.priority)
    if not runs.exists():
        return []
    return (Job.objects.filter(instance__fleet=fleet, superseded=False, status__in=PLACED, run_id__in=runs)
            .values_list("run_id", "run__name", "run__priority", "run__submitted_at", "instance__resources"))


def stop_run(run_id: int, said: str) -> Run | None:
    """Stop one chosen run, in the caller's transaction: its move to terminating is the guard (a run
    another step moved since it was read is left alone: None); its jobs get their stop with the
    run's grace. `said` (its `{grace}` filled in) is the victim's own event and its jobs' message."""
    victim = Run.objects.select_related("project").get(pk=run_id)
    said = said.format(grace=stop_grace(victim))
    if not move_run(victim, RunStatus.TERMINATING, frm=[RunStatus.PROVISIONING, RunStatus.RUNNING], message=said):
        return None
    for job in victim.current_jobs():
        if job.status in JOB_ACTIVE:
            job.run = victim
            terminate_job(job, JobReason.PREEMPTED, said)
    return victim
