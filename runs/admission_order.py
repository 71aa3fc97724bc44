"""The admission look's order, on a shared fleet across the projects sharing it.

A fleet of one project: its runs that may use the fleet in its queue order (runs/admission.py). A
shared fleet: each sharing project's runs that may use it (the owner's call it `name`, the others'
`owner/name`, or write no `fleets:`), read as runs/admission.py reads one project's, then taken
project by project furthest below its share first (instances/shares.fair_order: dominant share
over hosts and GPUs, Kueue's and DRF's rule), each project's own runs in its queue order. One read
per project sharing the fleet (with the heads' ages), one aggregate of what each project holds.
"""

from __future__ import annotations

from instances import shares
from runs import admission


def heads_for(fleet, limit: int) -> list[admission.Head]:
    """The waiting jobs the fleet's look considers, in the order it offers the idle hosts."""
    found = shares.shares_of([fleet.pk]).get(fleet.pk)
    if not found:
        return admission.waiting_heads(fleet.project_id, {fleet.name}, limit)
    owner = found.get(fleet.project_id)
    per_project = {}
    for project_id in found:
        names = {fleet.name} if project_id == fleet.project_id else {f"{owner.project if owner else ''}/{fleet.name}"}
        per_project[project_id] = admission.waiting_heads(project_id, names, limit)
    by_pk = {h.pk: h for heads in per_project.values() for h in heads}
    fair = {p: [(h.pk, {"hosts": h.demand, "gpus": 0}, h.since) for h in heads] for p, heads in per_project.items()}
    order = shares.fair_order(shares.usage_of(fleet.pk), {p: s.quota for p, s in found.items()}, fair, limit)
    return [by_pk[pk] for pk in order]
