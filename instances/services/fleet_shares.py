"""Writing a fleet's shares (its `quota`, `borrowing_limit`, `shared_with`): the checks that need
the database (the projects named exist and are not the owner; GPU quotas against the hosts
registered), the FleetShare rows, and a re-apply that changes only the shares (updated in place).

The rules that need only the configuration are runs/configuration/fleet_shares.py's; the quota
rules themselves are instances/shares.py's.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Sum

from engine import messages
from events.services import record
from instances.models import Fleet, FleetShare, InstanceStatus
from muster.api_errors import InvalidInput
from projects.models import Project
from runs.configuration.fleet_shares import SHARE_KEYS


def rows_for(owner: Project, conf: dict, gpus: int | None = None) -> list[FleetShare]:
    """The FleetShare rows of `conf` (none when it shares nothing), unsaved; a 400 naming the field
    for a project unknown or the owner's own. `gpus`: the fleet's registered GPUs, when known."""
    shared = conf.get("shared_with") or []
    if not shared:
        return []
    names = [s["project"] for s in shared]
    known = dict(Project.objects.filter(name__in=names).values_list("name", "pk"))
    for i, share in enumerate(shared):
        if share["project"] == owner.name:
            raise InvalidInput(["shared_with", i, "project"], f"project {owner.name} owns the fleet: its own "
                               "quota is the fleet's `quota` key, not a share")
        if share["project"] not in known:
            raise InvalidInput(["shared_with", i, "project"], f"there is no project named {share['project']}")
    hosts = len(conf["ssh_config"]["hosts"])
    own = conf.get("quota") or {}
    given_gpus = sum((s["quota"].get("gpus") or 0) for s in shared) + (own.get("gpus") or 0)
    if gpus is not None and given_gpus > gpus:
        raise InvalidInput(["shared_with"], f"the GPU quotas together ({given_gpus}) are above the fleet's {gpus} GPUs")
    rows = [FleetShare(project_id=known[s["project"]], **_columns(s["quota"], s.get("borrowing_limit")))
            for s in shared]
    if not own:  # the owner's quota: what the others are not given
        own = {"hosts": max(0, hosts - sum(r.hosts or 0 for r in rows))}
        if any(r.gpus is not None for r in rows) and gpus is not None:
            own["gpus"] = max(0, gpus - sum(r.gpus or 0 for r in rows))
    rows.append(FleetShare(project_id=owner.pk, **_columns(own, conf.get("borrowing_limit"))))
    return rows


def _columns(quota: dict, limit: dict | None) -> dict:
    limit = limit or {}
    return {"hosts": quota.get("hosts"), "gpus": quota.get("gpus"), "borrow_hosts": limit.get("hosts"),
            "borrow_gpus": limit.get("gpus")}


def write(fleet: Fleet, rows: list[FleetShare]) -> None:
    """The fleet's shares become `rows`, in the caller's transaction."""
    FleetShare.objects.filter(fleet=fleet).delete()
    for row in rows:
        row.fleet = fleet
    FleetShare.objects.bulk_create(rows)


def only_shares_differ(stored: dict, conf: dict) -> bool:
    """Whether the configuration applied again differs from the stored one in its sharing keys only."""
    def rest(c: dict) -> dict:
        return {k: v for k, v in c.items() if k not in SHARE_KEYS}
    return rest(stored) == rest(conf)


def update_in_place(fleet: Fleet, conf: dict, actor: str) -> Fleet:
    """A re-apply that changes only the shares: the rows and the stored keys updated, an event saying
    what changed. Lowering a quota below what a project holds stops nobody: it only holds new placements."""
    gpus = (fleet.instances.exclude(status=InstanceStatus.TERMINATED).aggregate(n=Sum("gpu_count"))["n"] or 0)
    rows = rows_for(fleet.project, conf, gpus=gpus)
    before = {k: fleet.configuration.get(k) for k in SHARE_KEYS}
    after = {k: conf.get(k) for k in SHARE_KEYS}
    with transaction.atomic():
        Fleet.objects.select_for_update(no_key=True).filter(pk=fleet.pk).values_list("pk", flat=True).first()
        write(fleet, rows)
        fleet.configuration = {**fleet.configuration, **after}
        fleet.save(update_fields=["configuration"])
        changed = [k for k in SHARE_KEYS if before[k] != after[k]]
        said = ", ".join(f"{k}: {_said(after[k])}" for k in changed) or "nothing changed"
        record(fleet.project_id, f"fleet {fleet.name}", f"shares updated: {said}", actor=actor)
        # the runs waiting for it may fit now: the fleet's admission look (engine/admission.py)
        messages.admit_fleet(fleet.pk)  # sent after the commit
    return fleet


def _said(value) -> str:
    if not value:
        return "none"
    if isinstance(value, list):
        return "; ".join(f"{s['project']} quota {_said(s['quota'])}"
                         + (f" borrowing {_said(s['borrowing_limit'])}" if s.get("borrowing_limit") else "")
                         for s in value)
    return ", ".join(f"{k} {v}" for k, v in value.items() if v is not None)
