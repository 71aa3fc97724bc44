"""Which waiting runs the idle hosts of a fleet go to: the choice of engine/admission.py's look.

The runs that may use the fleet (its project's runs whose `fleets:` is empty or names it) are read
in the queue's order (runs/queue.py), a page at a time, as far as the idle hosts and the look's
promises need. Each one's demand is what it still needs of this fleet: a service replica its nodes,
a task the jobs of its groups that go to hosts Muster is given (a TPU group's slice is made, not
taken), each group with its resources. The first ones whose demand the idle hosts can hold (the
hosts that fit each group's resources, `fits`) are woken: BestEffortFIFO, Kueue's default queueing
strategy, so one too big for what is idle now is passed over and keeps its place.

A job a recent look woke is not woken again: while its promise lasts its demand counts as taken
(whether or not its placement is under way), and after that it is passed over until its own recheck
(it was woken for hosts that fit and did not take them: a race, or its quota).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from runs import queue
from runs.choices import JobStatus
from runs.models import Job

PAGE = 200  # waiting jobs read at a time
SCAN = 2000  # at most this many read per project and look (the rest: their rechecks)


@dataclass
class Head:
    """A waiting job and what it needs of the fleet: [(resources, count)] per group."""

    pk: int
    groups: list[tuple[dict, int]] = field(default_factory=list)
    # a task whose every job goes to given hosts: the look may place it itself (engine/admission.py);
    # a service replica or a run with a slice to make is woken to its own step
    here: bool = False
    since: float = 0.0  # its run's submission, as a number (a shared fleet's order between projects)

    @property
    def demand(self) -> int:
        return sum(n for _, n in self.groups)


def may_use(written: list | None, names: set[str]) -> bool:
    """Whether a run whose `fleets:` is `written` may use a fleet it calls by one of `names`."""
    return not written or any(name in names for name in written)


def _tpu(resources: dict | None) -> bool:
    return bool(((resources or {}).get("gpu") or {}).get("tpu"))


def _task_groups(run_ids: list[int]) -> tuple[dict[int, list[tuple[dict, int]]], set[int]]:
    """Per task run: the groups its jobs without a host still need of a static fleet (one query),
    and the runs with a group whose hosts a backend makes (a TPU slice)."""
    found: dict[int, dict[int, list]] = {}
    made: set[int] = set()
    rows = (Job.objects.filter(run_id__in=run_ids, superseded=False, status=JobStatus.SUBMITTED,
                               instance__isnull=True).values_list("run_id", "node_group_index", "spec__resources"))
    for run_id, group, resources in rows:
        if _tpu(resources):
            made.add(run_id)
            continue  # its backend makes the group's hosts
        entry = found.setdefault(run_id, {}).setdefault(group, [resources or {}, 0])
        entry[1] += 1
    return {run_id: [(req, n) for _, (req, n) in sorted(groups.items())] for run_id, groups in found.items()}, made


def waiting_heads(project_id: int, names: set[str], limit: int) -> list[Head]:
    """The project's jobs waiting for a host that may use the fleet (`names`: what its runs call it),
    in queue order, at most `limit` of them, each with its demand."""
    heads: list[Head] = []
    ordered = queue.waiting_jobs(project_id).values_list(
        "pk", "run_id", "run__configuration__type", "run__configuration__fleets", "spec__resources",
        "spec__nodes_in_group", "run__submitted_at")
    size = min(PAGE, max(limit, 1))  # a look for one host reads a short page, not PAGE rows and their groups
    for start in range(0, SCAN, size):
        page = list(ordered[start:start + size])
        usable = [row for row in page if may_use(row[3], names)]
        tasks, made = _task_groups([row[1] for row in usable if row[2] != "service"])
        for pk, run_id, kind, _, resources, nodes, submitted in usable:
            if kind == "service":
                groups = [] if _tpu(resources) else [(resources or {}, int(nodes or 1))]
            else:
                groups = tasks.get(run_id, [])
            if groups:
                heads.append(Head(pk, groups, here=kind != "service" and run_id not in made,
                                  since=submitted.timestamp()))
        if len(heads) >= limit or len(page) < size:
            break
    return heads[:limit]


def still_waiting(job_ids) -> list[int]:
    """Those of `job_ids` still waiting for a host (a look's promises to the others are kept)."""
    if not job_ids:
        return []
    return list(Job.objects.filter(pk__in=list(job_ids), status=JobStatus.SUBMITTED,
                                   waiting_for__startswith=queue.PREFIX).values_list("pk", flat=True))


def choose(heads: list[Head], idle: int, live: dict[int, int], passed: set[int],
           fits: Callable[[dict, int], int]) -> list[int]:
    """The jobs to wake among `heads` for `idle` hosts. `live`: {job id: demand} of the jobs a look
    woke whose promise lasts (counted as taken); `passed`: jobs woken before that still wait;
    `fits(resources, at_most)`: how many idle hosts fit those resources (read once per kind)."""
    free = idle - sum(live.values())
    fitting: dict[str, int] = {}
    picks = []
    for head in heads:
        if free <= 0:
            break
        if head.pk in live or head.pk in passed or head.demand > free:
            continue
        keys = [json.dumps(req, sort_keys=True) for req, _ in head.groups]
        for key, (req, _) in zip(keys, head.groups, strict=True):
            if key not in fitting:
                fitting[key] = fits(req, idle)
        if any(fitting[key] < n for key, (_, n) in zip(keys, head.groups, strict=True)):
            continue  # the idle hosts do not fit its resources
        picks.append(head.pk)
        free -= head.demand
        for key in fitting:  # which hosts it takes is placement's: count them gone from every kind
            fitting[key] -= head.demand
    return picks
