"""Which fleet each group of a run goes to: one fleet for the whole run when one can hold it (as
always), else each group on a fleet of its own choice, so a run may span fleets (a CPU router on
an SSH fleet beside a TPU slice on a gcp fleet).

A group's candidates are the run's (its `fleets:`, or every active fleet it may use) narrowed by
the group's own `fleets:`, in the group's order when it gives one. Groups that share a static
fleet must fit on it together (each host takes one job), which the same greedy test as a single
fleet answers; a cloud fleet makes each group's hosts, so it only needs an offer.
"""

from __future__ import annotations

from instances import fitting, shares
from instances.models import Fleet, Placement
from runs.models import Job, Run

Demand = tuple[dict, int]  # (requirements, node count)


def group_fleet_names(configuration: dict) -> list[list[str]]:
    """Each group's own `fleets:` (empty: no choice of its own), in group order."""
    return [list(g.get("fleets") or []) for g in configuration.get("groups") or []]


def candidates_per_group(fleets: list[Fleet], own: list[list[str]], groups: int) -> list[list[Fleet]]:
    by_name = {fitting.written_name(f): f for f in fleets}
    out = []
    for g in range(groups):
        names = own[g] if g < len(own) else []
        out.append([by_name[n] for n in names if n in by_name] if names else list(fleets))
    return out


def assign(fleets: list[Fleet], own: list[list[str]], demands: list[Demand], pools: list | None = None,
           at_least=None, busy_too: bool = False, project_id: int | None = None) -> list[Fleet] | None:
    """A fleet per group (in group order), or None when some group has nowhere to go.

    `pools`, `at_least`: as fitting.static_fleet_fits, filled only when one fleet holds the whole
    run (the plan then shows the hosts the fit test read instead of reading them again). `busy_too`:
    the fleets it would get once their busy hosts are free again (a run that waits for a host).
    `project_id`: the run's project, whose quota on a shared fleet (instances/shares.py) must let
    it take the run now (with `busy_too`: ever, with its whole borrowing limit), else it is skipped."""
    if project_id is not None:
        refused = shares.quota_refusals(fleets, project_id, demands, at_all=busy_too)
        fleets = [f for f in fleets if f.pk not in refused]
    per_group = candidates_per_group(fleets, own, len(demands))
    allowed_by_all = [f for f in fleets if all(f in c for c in per_group)]
    whole = fitting.first_fitting_fleet(allowed_by_all, demands, pools, at_least, busy_too)
    if whole is not None:
        return [whole] * len(demands)
    if len(demands) == 1:
        return None  # the one group is the whole run: every fleet it may use has just been tried
    if pools is not None:
        pools.clear()  # what a fleet that did not fit left there is no group's answer
    multi_node = sum(n for _, n in demands) > 1
    chosen: list[Fleet | None] = [None] * len(demands)
    # groups with the fewest choices first, then GPU/TPU groups: the scarce hosts go to who needs them
    order = sorted(range(len(demands)), key=lambda g: (len(per_group[g]), not (demands[g][0].get("gpu") or {}), g))
    for g in order:
        for fleet in per_group[g]:
            if fitting.is_static(fleet):
                if multi_node and fleet.placement != Placement.CLUSTER:
                    continue  # the run's nodes must reach each other on a private network
                sharing = [demands[o] for o in range(len(demands)) if chosen[o] is not None and chosen[o].pk == fleet.pk]
                if fitting.static_fleet_fits(fleet, [*sharing, demands[g]], busy_too=busy_too):
                    chosen[g] = fleet
                    break
            elif fitting.cloud_fleet_fits(fleet, [demands[g]]):
                chosen[g] = fleet
                break
        if chosen[g] is None:
            return None
    return chosen  # type: ignore[return-value]


def choose(run: Run, jobs: list[Job] | None = None, busy_too: bool = False,
           usable: list[Fleet] | None = None) -> list[Fleet] | None:
    """The fleet of each group of the run's current submission (fitting.group_demands order);
    `busy_too`: counting the hosts that are busy now as well; `usable`: fitting.usable_fleets(run)
    as the caller already read it."""
    return assign(fitting.candidate_fleets(run, usable), group_fleet_names(run.configuration),
                  fitting.group_demands(run, jobs), busy_too=busy_too, project_id=run.project_id)


def wait_words(project_id: int, full: list[Fleet], run: Run, jobs: list[Job] | None) -> str:
    """What a run waits for: the quota of a shared fleet that refuses it now ("quota: ..."), else
    the fleets that are full (full_fleets)."""
    refused = shares.quota_refusals(full, project_id, fitting.group_demands(run, jobs))
    return next((refused[f.pk] for f in full if f.pk in refused), None) or full_fleets(full)


def full_fleets(fleets: list[Fleet]) -> str:
    """The words for fleets a run waits for ("fleet gpus is full"): the engine's wait and the plan say the same."""
    names = sorted({f.name for f in fleets})
    return f"fleet {names[0]} is full" if len(names) == 1 else f"fleets {', '.join(names)} are full"


def waits_on_full_fleet(configuration: dict) -> bool:
    """Whether the run's retry lets it wait for hosts of a full fleet (the engine also bounds the
    wait by retry.duration, counted from submission)."""
    return "no-capacity" in ((configuration.get("retry") or {}).get("on_events") or [])
