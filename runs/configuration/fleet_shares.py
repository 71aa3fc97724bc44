"""A fleet's sharing keys (Muster's own; dstack's `exports` carry no quotas): `quota` and
`borrowing_limit` of the owner, and `shared_with`, each project's quota and borrowing limit.

Only the rules that need nothing but the configuration are here (shape, bounds, duplicates, the
quotas together against the fleet's configured hosts); whether a project exists, and the GPUs of
hosts registered, are asked when the fleet is applied (instances/services/fleet_shares.py).
"""

from __future__ import annotations

from typing import Any

from .errors import ErrorList
from .fields import CheckedModel

SHARE_KEYS = ("quota", "borrowing_limit", "shared_with")
RESOURCES = ("hosts", "gpus")


class Amount(CheckedModel):
    """Hosts and/or GPUs; None: no quota (or no borrowing) on that resource."""

    hosts: int | None = None
    gpus: int | None = None


class SharedWith(CheckedModel):
    project: str
    quota: Amount
    borrowing_limit: Amount | None = None


def _amount(value: Any, loc: list, errors: ErrorList, what: str) -> Amount | None:
    if not isinstance(value, dict) or not value or set(value) - set(RESOURCES):
        errors.add(loc, f"{what} is a mapping of hosts and/or gpus, e.g. {{hosts: 2}} or {{gpus: 16}}")
        return None
    out = {}
    for key, number in value.items():
        if type(number) is not int or number < 0:
            errors.add([*loc, key], f"{what}.{key} must be a whole number of at least 0, not {number!r}")
            return None
        out[key] = number
    return Amount(**out)


def parse_shares(written: dict, hosts: int | None, errors: ErrorList) -> dict:
    """The checked `quota`, `borrowing_limit` and `shared_with` of a fleet configuration as
    written (`hosts`: its configured host count, None for a fleet that creates its instances)."""
    before = len(errors.items)
    present = [k for k in SHARE_KEYS if written.get(k) is not None]
    if not present:
        return {}
    if hosts is None:
        errors.add([present[0]], "only a fleet of hosts you have (ssh_config) may be shared: a fleet whose "
                   "instances Muster creates has no fixed hosts to give quotas of")
        return {}
    quota = _amount(written["quota"], ["quota"], errors, "quota") if written.get("quota") is not None else None
    limit = (_amount(written["borrowing_limit"], ["borrowing_limit"], errors, "borrowing_limit")
             if written.get("borrowing_limit") is not None else None)
    shared = written.get("shared_with")
    if not isinstance(shared, list) or not shared:
        errors.add([present[0]], "quota and borrowing_limit are for a shared fleet: list the projects it is "
                   "shared with in `shared_with` (each with a quota), or remove them")
        return {}
    shares: list[SharedWith] = []
    seen: set[str] = set()
    for i, item in enumerate(shared):
        loc = ["shared_with", i]
        if not isinstance(item, dict) or set(item) - {"project", "quota", "borrowing_limit"}:
            errors.add(loc, "each share is {project: NAME, quota: {hosts: N}, borrowing_limit: {hosts: N}}")
            continue
        project = item.get("project")
        if not isinstance(project, str) or not project:
            errors.add([*loc, "project"], "name the project the fleet is shared with")
            continue
        if project in seen:
            errors.add([*loc, "project"], f"project {project} is listed twice: give it one share")
            continue
        seen.add(project)
        if item.get("quota") is None:
            errors.add([*loc, "quota"], f"project {project} needs a quota: {{hosts: N}} and/or {{gpus: N}}")
            continue
        share_quota = _amount(item["quota"], [*loc, "quota"], errors, "quota")
        share_limit = (_amount(item["borrowing_limit"], [*loc, "borrowing_limit"], errors, "borrowing_limit")
                       if item.get("borrowing_limit") is not None else None)
        if share_quota is not None:
            shares.append(SharedWith(project=project, quota=share_quota, borrowing_limit=share_limit))
    if len(errors.items) > before:
        return {}
    given = sum(s.quota.hosts or 0 for s in shares) + ((quota.hosts or 0) if quota else 0)
    if given > hosts:
        errors.add(["shared_with"], f"the quotas together ({given} hosts) are above the fleet's {hosts} hosts")
        return {}
    return {"quota": quota, "borrowing_limit": limit, "shared_with": shares}
