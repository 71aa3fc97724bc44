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

Not built: shared fleets and quotas (issue 43 items 2-3): a fleet is one project's, so preemption
never crosses projects; a run waiting on several fleets at once (a run whose groups span fleets)
and a service do not preempt, and services are never preempted.
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


def choose(candidates: list[Candidate], need: int) -> list[Candidate]:
    """The fewest and lowest-priority candidates whose hosts add up to `need`, or [] when all of them
    together do not (nothing is stopped for a run that would still not fit)."""
    if need <= 0:
        return []
    order = sorted(candidates, key=lambda c: (c.priority, -c.hosts, -c.submitted_at.timestamp(), -c.run_id))
    chosen, freed = [], 0
    for candidate in order:
        if freed >= need:
            break
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
    if job.job_num != 0 or run.priority <= 0 or len({f.pk for f in fleets}) != 1 or not fitting.is_static(fleets[0]):
        return ""
    fleet = fleets[0]
    demands = fitting.group_demands(run, siblings)
    useful = [req for req, _ in demands]

    def usable(resources: dict) -> bool:
        return any(fits(req, resources or {}) for req in useful)

    held: dict[int, list] = {}
    for row in _candidate_jobs(run, fleet):
        held.setdefault(row[0], []).append(row)
    if not held:
        return ""  # the common case, one query: nothing on the fleet may be preempted for this run
    idle = sum(1 for resources in Instance.objects.filter(fleet=fleet, status=InstanceStatus.IDLE, unreachable=False)
               .values_list("resources", flat=True) if usable(resources))
    coming = sum(1 for resources in Job.objects.filter(instance__fleet=fleet, status=JobStatus.TERMINATING,
                                                        keep_host=False).values_list("instance__resources", flat=True)
                 if usable(resources))
    need = sum(count for _, count in demands) - idle - coming
    candidates = [Candidate(run_id, rows[0][1], rows[0][2], rows[0][3], sum(1 for r in rows if usable(r[4])))
                  for run_id, rows in held.items()]
    stopped = [c for c in choose([c for c in candidates if c.hosts], need) if _preempt(c, run, fleet)]
    if not stopped:
        return ""
    names = ", ".join(f"{c.name} (priority {c.priority})" for c in stopped)
    return f"; stopping preemptible run{'s' if len(stopped) > 1 else ''} {names} for its hosts"


def _candidate_jobs(run: Run, fleet: Fleet):
    return (Job.objects.filter(instance__fleet=fleet, superseded=False, status__in=PLACED,
                               run__project_id=run.project_id, run__priority__lt=run.priority,
                               run__status__in=(RunStatus.PROVISIONING, RunStatus.RUNNING), run__stop_requested="",
                               run__configuration__type="task", run__configuration__profile__preemptible=True)
            .values_list("run_id", "run__name", "run__priority", "run__submitted_at", "instance__resources"))


def _preempt(candidate: Candidate, waiter: Run, fleet: Fleet) -> bool:
    """Stop one run for `waiter`: its move to terminating is the guard (a run another step moved since
    it was read is left alone); its jobs get their stop with the run's grace. One event on each run."""
    victim = Run.objects.select_related("project").get(pk=candidate.run_id)
    grace = stop_grace(victim)
    said = (f"preempted by run {waiter.name} (priority {waiter.priority}), which needs hosts of fleet {fleet.name}: "
            f"its jobs get the stop signal and {grace}s to end")
    with transaction.atomic():
        if not move_run(victim, RunStatus.TERMINATING, frm=[RunStatus.PROVISIONING, RunStatus.RUNNING], message=said):
            return False
        for job in victim.current_jobs():
            if job.status in JOB_ACTIVE:
                job.run = victim
                terminate_job(job, JobReason.PREEMPTED, said)
        record(waiter.project_id, f"run {waiter.name}",
               f"preempts run {victim.name} (priority {victim.priority}, preemptible) for {candidate.hosts} hosts of "
               f"fleet {fleet.name}", status=waiter.status, run_id=waiter.pk)
    return True
