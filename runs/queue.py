"""The queue: a project's runs waiting for a host of a full fleet, in the order a host given back
goes to them (engine/submitted/waiting.py wakes them in this order): the highest `priority` first,
then the oldest submission. `muster queue`, the API's `queue/`, `muster ps` and the plan read it here.

A wait is a job's: job 0 of a task, or the first node of each service replica that waits. One query
reads the queue in order (the runs' index `run_queue_order`: project, priority descending,
submission, id, over unfinished runs), however many runs the project has finished.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, F, Q, QuerySet, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from instances.models import Fleet, FleetShare
from muster.api_errors import InvalidInput
from runs.choices import RUN_FINISHED, WAITING_FOR_HOST, JobStatus
from runs.configuration.dialect import PRIORITY_DEFAULT
from runs.models import Job

PREFIX = WAITING_FOR_HOST
# the queue's order on Job rows: the run's priority, its submission, then the job (replicas of one service)
ORDER = ("-run__priority", "run__submitted_at", "run_id", "pk")


def waiting_jobs(project_id: int) -> QuerySet:
    """The project's jobs waiting for a host, in queue order. The run's status is repeated from the
    index's condition so the planner may read the index in order and stop early."""
    return (Job.objects.filter(run__project_id=project_id, status=JobStatus.SUBMITTED, superseded=False,
                               waiting_master_job=False, waiting_for__startswith=PREFIX)
            .filter(~Q(run__status__in=RUN_FINISHED)).order_by(*ORDER))


def anyone_waiting() -> bool:
    """Whether any job of any project waits for a host: one indexed look (the jobs' status index),
    so a host given back while nobody waits costs no admission look (engine/submitted/waiting.py)."""
    return Job.objects.filter(status=JobStatus.SUBMITTED, superseded=False, waiting_master_job=False,
                              waiting_for__startswith=PREFIX).exists()


def waiting_per_project() -> dict[int, int]:
    """{project id: its runs waiting for a host} (a service with several replicas waiting counts once):
    one grouped query over the waiting jobs (the jobs' status index), for /metrics."""
    everyone = (Job.objects.filter(status=JobStatus.SUBMITTED, superseded=False, waiting_master_job=False,
                                   waiting_for__startswith=PREFIX).filter(~Q(run__status__in=RUN_FINISHED)))
    return dict(everyone.values("run__project_id").annotate(n=Count("run_id", distinct=True)).order_by()
                .values_list("run__project_id", "n"))


def priority_of(configuration: dict) -> int:
    """A run's priority as written (dstack's `priority`, kept in the configuration's profile), or dstack's default."""
    value = (configuration.get("profile") or {}).get("priority")
    return PRIORITY_DEFAULT if value is None else int(value)


def positions(project_id: int, run_ids: list[int]) -> dict[int, int]:
    """{run id: its place in the project's queue (1 first)} for those of `run_ids` that wait: one
    query over the waiting jobs (at most MUSTER_MAX_WAITING_RUNS_PER_PROJECT of them) with a row
    number in queue order. A service with several replicas waiting takes its first one's place."""
    if not run_ids:
        return {}
    ranked = waiting_jobs(project_id).annotate(place=Window(
        RowNumber(), order_by=[F("run__priority").desc(), F("run__submitted_at").asc(), F("run_id").asc(),
                               F("pk").asc()])).values_list("run_id", "place")
    wanted, found = set(run_ids), {}
    for run_id, place in ranked:
        if run_id in wanted and run_id not in found:
            found[run_id] = place
    return found


def place_for_new(project_id: int, priority: int) -> int:
    """The place a run of `priority` submitted now would take: after every waiting run of its
    priority or higher (they are older), before the lower ones."""
    return waiting_jobs(project_id).filter(run__priority__gte=priority).count() + 1


FLEET_NAMES = re.compile(r"\bfleets? ([a-z0-9][a-z0-9-]*(?:, [a-z0-9][a-z0-9-]*)*)")


def waits_on(waiting_for: str, fleet: str) -> bool:
    """Whether a wait names `fleet`: the engine's words are "fleet F is full", "fleets A, B are full"
    (instances/spanning.full_fleets) or, for a gang that fell short, "... hosts of fleet F ..."."""
    return any(fleet in m.group(1).split(", ") for m in FLEET_NAMES.finditer(waiting_for))


@dataclass(frozen=True)
class Asked:
    """A fleet a queue is filtered by: the project's own (`name`) or one shared with it (`owner/name`)."""
    pk: int
    name: str  # its own name: the one the engine's words give it
    written: str  # as the caller named it
    shared: bool  # another project's, shared with the caller's
    ambiguous: bool = False  # shared, and the project has a fleet of that name too: the words alone do not tell


def waits_for(row: dict, fleet: Asked) -> bool:
    """Whether a queue row waits for `fleet`: the fleet its job 0 records (Job.waiting_fleet, the first
    it waits for), else the fleets its words name. The words name a fleet by its own name, so a shared
    fleet called like one of the project's is known by the record only."""
    if row["_fleet_id"] == fleet.pk:
        return True
    if row["_fleet_name"] == fleet.name:
        return False  # the name in the words is that other fleet's
    return not fleet.ambiguous and waits_on(row["reason"], fleet.name)


def fleet_asked(project, query) -> Asked | None:
    """The `fleet` a queue is asked for, checked: a fleet of the project, or one another project shares
    with it written `owner/name` (instances/rows.active_fleets' rule); else a 400 naming it."""
    name = query.get("fleet")
    if name is None:
        return None
    own = dict(Fleet.objects.filter(project=project).values_list("name", "pk"))
    shared = {f"{owner}/{bare}": (pk, bare) for pk, owner, bare in FleetShare.objects.filter(project=project)
              .exclude(fleet__project=project).values_list("fleet_id", "fleet__project__name", "fleet__name")}
    if name in own:
        return Asked(own[name], name, name, False)
    if name in shared:
        pk, bare = shared[name]
        return Asked(pk, bare, name, True, ambiguous=bare in own)
    known = ", ".join(sorted([*own, *shared])[:20])
    raise InvalidInput(["fleet"], f"project {project.name} has no fleet {name!r}"
                                  + (f": its fleets are {known}" if known else ": it has no fleets"))


def queue(project, fleet: Asked | None = None, now: datetime | None = None) -> list[dict]:
    """The project's waiting runs in queue order, each with its place, what it waits for and for how
    long: only this project's runs (another project's queue is not shown, even on a fleet both use).
    `fleet`: only the runs waiting for it (fleet_asked), in their places in the project's queue."""
    now = now or timezone.now()
    rows = waiting_jobs(project.pk).values_list(
        "run__name", "run__priority", "run__configuration__type", "node_group_name", "replica_num", "job_num",
        "waiting_for", "created", "waiting_fleet_id", "waiting_fleet__name")
    answer = []
    for place, (name, priority, kind, group, replica, job_num, why, since, fleet_id, fleet_name) in enumerate(
            rows, start=1):
        reason = why[len(PREFIX):].lstrip(": ")
        row = {
            "position": place, "project": project.name, "run": name, "priority": priority,
            "job": f"{group}/{replica}" if kind == "service" else job_num,
            "waiting_for": why, "reason": reason, "waiting_since": since,
            "wait_seconds": max(0, round((now - since).total_seconds())),
            "_fleet_id": fleet_id, "_fleet_name": fleet_name,  # for waits_for; not in the API's rows
        }
        if fleet is None or waits_for(row, fleet):
            answer.append(row)
    return answer
