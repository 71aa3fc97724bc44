"""Shared fleets: each project's quota on a fleet it shares, what it holds there, whether a
placement stays within its quota plus what it may borrow, and who gets the next freed hosts.

The rules are plain functions over (quotas, usage, demand), so placement (under the fleet's lock,
engine/submitted/placement.py), the fleet choice and the plan (instances/spanning.py) and the wake
of waiting runs (engine/submitted/waiting.py, `fair_order`) all answer the same way. A fleet with
no FleetShare rows is not shared: nothing here applies to it.

- A project's room on a resource (hosts, GPUs) it has a quota on = its quota + min(its borrowing
  limit, what the others leave unused of theirs + what no quota gives). A resource it has no quota
  on (None) is not limited.
- Usage = the hosts (and their GPUs) the project's jobs hold on the fleet: a count of the fleet's
  hosts by holder (Instance.holder), whatever the number of jobs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Count, Sum

from instances import rows
from instances.models import Fleet, FleetShare, Instance, InstanceStatus
from muster.step_reads import fresher, once, update

RESOURCES = ("hosts", "gpus")
NOUN = {"hosts": "hosts", "gpus": "GPUs"}


class Refusal(str):
    """A quota's refusal (`refusal`, `within`): a line like any other of placement's, which a caller
    tells from "short of idle hosts" by its type, never by its words (a group may be named `quota`)."""


QUOTA_PREFIX = "quota:"  # how every refusal's words start (docs/queueing.md)
Amounts = dict[str, int]  # {"hosts": n, "gpus": n}


@dataclass(frozen=True)
class Share:
    project_id: int
    project: str
    quota: dict[str, int | None]  # per resource; None: no quota on it
    borrow: dict[str, int | None]  # per resource; None: borrows nothing


def shares_of(fleet_ids: Iterable[int]) -> dict[int, dict[int, Share]]:
    """{fleet id: {project id: Share}} of the shared fleets among `fleet_ids` (one query; inside
    muster/step_reads.py `kept`, once per set of fleets)."""
    ids = tuple(sorted(set(fleet_ids)))
    return once(("shares", ids), lambda: _shares_of(ids))


def _shares_of(fleet_ids: tuple[int, ...]) -> dict[int, dict[int, Share]]:
    out: dict[int, dict[int, Share]] = {}
    rows = FleetShare.objects.filter(fleet_id__in=list(fleet_ids)).values_list(
        "fleet_id", "project_id", "project__name", "hosts", "gpus", "borrow_hosts", "borrow_gpus")
    for fleet_id, project_id, name, hosts, gpus, borrow_hosts, borrow_gpus in rows:
        out.setdefault(fleet_id, {})[project_id] = Share(project_id, name, {"hosts": hosts, "gpus": gpus},
                                                         {"hosts": borrow_hosts, "gpus": borrow_gpus})
    return out


def usage_of(fleet_id: int) -> dict[int, Amounts]:
    """{project id: {"hosts", "gpus"}} held on the fleet by each project's jobs (one count of its
    hosts by holder: instances/rows.held, as the console's usage table reads it; inside
    muster/step_reads.py `kept`, once per step)."""
    return once(("usage", fleet_id), lambda: fresh_usage_of(fleet_id))


def took(fleet_id: int, project_id: int, taken: list[Instance]) -> None:
    """Hosts the step just took on the fleet for the project, counted in the usage it keeps (muster/
    step_reads.py) on top of what `within` read under the lock, so its next runs choose with its own
    placements counted: a run chosen past its quota would be put on the fleet (the run's move) before
    `within` refuses it."""
    def more(usage: dict[int, Amounts]) -> dict[int, Amounts]:
        mine = usage.get(project_id, {})
        return {**usage, project_id: {"hosts": mine.get("hosts", 0) + len(taken),
                                      "gpus": mine.get("gpus", 0) + sum(i.gpu_count for i in taken)}}
    update(("usage", fleet_id), more)


def fresh_usage_of(fleet_id: int) -> dict[int, Amounts]:
    """usage_of read now, whatever the step has read before: for a decision that writes (a reclaim
    stops another project's runs on it; `within` gives hosts)."""
    return {project: {"hosts": hosts, "gpus": gpus} for (_, project), (hosts, gpus) in rows.held([fleet_id]).items()}


def totals_of(fleet_id: int) -> Amounts:
    """The fleet's live hosts and their GPUs (inside muster/step_reads.py `kept`, once per step)."""
    return once(("totals", fleet_id), lambda: _totals_of(fleet_id))


def _totals_of(fleet_id: int) -> Amounts:
    agg = Instance.objects.filter(fleet_id=fleet_id).exclude(status=InstanceStatus.TERMINATED).aggregate(
        hosts=Count("id"), gpus=Sum("gpu_count"))
    return {"hosts": agg["hosts"] or 0, "gpus": agg["gpus"] or 0}


def borrowable(project_id: int, shares: dict[int, Share], usage: dict[int, Amounts], totals: Amounts,
               resource: str) -> int:
    """What the others leave unused of their quotas on `resource`, plus what no quota gives."""
    given = sum(s.quota[resource] or 0 for s in shares.values())
    unused = sum(max(0, (s.quota[resource] or 0) - usage.get(p, {}).get(resource, 0))
                 for p, s in shares.items() if p != project_id and s.quota[resource] is not None)
    return unused + max(0, totals[resource] - given)


def refusal(project_id: int, shares: dict[int, Share], usage: dict[int, Amounts], totals: Amounts,
            demand: Amounts, fleet: str, at_all: bool = False) -> str:
    """Why `demand` more of the fleet would pass the project's quota plus what it may borrow ("" when
    it would not). `at_all`: whether it could ever fit (its quota plus its whole borrowing limit,
    nothing held): a run that never could fails at once instead of waiting."""
    share = shares.get(project_id)
    if share is None:
        return Refusal(f"{QUOTA_PREFIX} fleet {fleet} is not shared with this project")
    for resource in RESOURCES:
        quota = share.quota[resource]
        if quota is None or not demand.get(resource):
            continue
        limit = share.borrow[resource] or 0
        held = 0 if at_all else usage.get(project_id, {}).get(resource, 0)
        free = limit if at_all else min(limit, borrowable(project_id, shares, usage, totals, resource))
        if held + demand[resource] <= quota + free:
            continue
        noun = NOUN[resource]
        lending = "none" if not limit else f"up to {limit}, {free} {'at most' if at_all else 'free now'}"
        return Refusal(f"{QUOTA_PREFIX} project {share.project} holds {held} of its {quota} {noun} of fleet {fleet} "
                       f"(borrowing: {lending}) and needs {demand[resource]}")
    return ""


def demand_of(demands: list[tuple[dict, int]]) -> Amounts:
    """The hosts and GPUs a run's groups ask for ((requirements, node count) each)."""
    gpus = 0
    for req, count in demands:
        gpu = req.get("gpu") or {}
        if not gpu.get("tpu"):
            gpus += ((gpu.get("count") or {}).get("min") or 0) * count
    return {"hosts": sum(count for _, count in demands), "gpus": gpus}


def quota_refusals(fleets: list[Fleet], project_id: int, demands: list[tuple[dict, int]],
                   at_all: bool = False) -> dict[int, str]:
    """{fleet id: why} for the shared fleets among `fleets` whose quota refuses the run now (or,
    `at_all`, ever). No query when the fleets were read knowing none is shared (rows.active_fleets
    sets `shared`), else one; a fleet shared: its usage and totals besides (not `at_all`)."""
    if all(hasattr(f, "shared") for f in fleets) and not any(f.shared for f in fleets):
        return {}
    shared = shares_of(f.pk for f in fleets)
    if not shared:
        return {}
    demand = demand_of(demands)
    out = {}
    for fleet in fleets:
        if fleet.pk in shared:
            # whether it could ever fit asks the quotas only: what is held and the fleet's size do not count
            usage, totals = ({}, {}) if at_all else (usage_of(fleet.pk), totals_of(fleet.pk))
            why = refusal(project_id, shared[fleet.pk], usage, totals, demand, fleet.name, at_all=at_all)
            if why:
                out[fleet.pk] = why
    return out


def within(fleet: Fleet, project_id: int, taken: list[Instance]) -> str:
    """Placement's check, with the fleet's row locked: may the project hold `taken` (hosts it has
    just taken, in this transaction) on the fleet? "" when the fleet is not shared or it may. What is held
    is read afresh here, under the lock, whatever the step has read before; the quotas and the
    fleet's size may be the step's (muster/step_reads.py): they change by an edit of the fleet, not by
    placements. The fresh read replaces the step's kept one, so `took` adds to what is exact as of the lock."""
    shared = shares_of([fleet.pk]).get(fleet.pk)
    if not shared:
        return ""
    demand = {"hosts": len(taken), "gpus": sum(i.gpu_count for i in taken)}
    # the take wrote the project as the hosts' holder, so the read counts them already: what the
    # project held before them is the read less the demand
    usage = fresh_usage_of(fleet.pk)
    mine = usage.get(project_id, {})
    before = {**usage, project_id: {r: mine.get(r, 0) - demand[r] for r in RESOURCES}}
    fresher(("usage", fleet.pk), before)
    return refusal(project_id, shared, before, totals_of(fleet.pk), demand, fleet.name)


def dominant_share(used: Amounts, quota: dict[str, int | None]) -> float:
    """DRF's dominant share: the largest of usage / quota over the resources the project has a quota on."""
    share = 0.0
    for resource in RESOURCES:
        q = quota.get(resource)
        if q is None:
            continue
        have = used.get(resource, 0)
        share = max(share, have / q if q else (float("inf") if have else 0.0))
    return share


def owed(share: Share, used: Amounts, demand: Amounts) -> bool:
    """Whether the project may reclaim lent hosts for `demand`: what it holds plus the demand stays
    within its nominal quota on every resource it has one on (and it has one on some resource)."""
    limited = [r for r in RESOURCES if share.quota[r] is not None]
    return bool(limited) and all(used.get(r, 0) + demand.get(r, 0) <= share.quota[r] for r in limited)


def lent(share: Share, used: Amounts) -> Amounts | None:
    """What a project holds above its nominal quota, per resource it holds at least its quota of: the
    most a reclaim may take from it without bringing it below its quota on any of them. None when it
    is not borrowing (above its quota on none)."""
    room = {r: used.get(r, 0) - share.quota[r] for r in RESOURCES
            if share.quota[r] is not None and used.get(r, 0) >= share.quota[r]}
    return room if any(v > 0 for v in room.values()) else None


# (job pk, what it takes, submitted at as a number): no priority, which orders a project's own heads only
Head = tuple[int, Amounts, float]


def fair_order(usage: dict[int, Amounts], quotas: dict[int, dict[str, int | None]],
               heads: dict[int, list[Head]], count: int) -> list[int]:
    """The waiting jobs `count` freed hosts wake, in order: each time the project furthest below its
    share (lowest dominant share, Kueue's and DRF's rule; its waiting jobs already in queue order),
    its share then counted as if its job were placed; ties by the heads' age (the older submission),
    then the project. Priority orders a project's own heads only: it never decides between projects,
    so a project that sets its runs to priority 100 does not pass another's. Pure: a claimed
    per-fleet step may call it as it is."""
    used = {p: dict(u) for p, u in usage.items()}
    left = {p: list(h) for p, h in heads.items() if h}
    picked: list[int] = []
    while left and len(picked) < count:
        def key(p: int):
            _, _, since = left[p][0]
            return (dominant_share(used.get(p, {}), quotas.get(p, {})), since, p)
        project = min(left, key=key)
        pk, takes, _ = left[project].pop(0)
        picked.append(pk)
        mine = used.setdefault(project, {"hosts": 0, "gpus": 0})
        for resource in RESOURCES:
            mine[resource] = mine.get(resource, 0) + takes.get(resource, 0)
        if not left[project]:
            del left[project]
    return picked
