"""dstack's fleet calls, through Muster's fleet services.

The client reads every identity_file itself and sends the private key in the plan request; it then
sends back the plan's `spec` to apply it (reference §3), so the plan must carry the key to the
apply. It carries it sealed: encrypted with the server's keys (muster/crypto.py), bound to the
caller and the project, and good for SEAL_SECONDS. The answer never holds the key in clear, and the
server keeps nothing between plan and apply.
"""

from __future__ import annotations

import json
import time
from typing import Any

from dstack_api.services import render, translate
from dstack_api.services.errors import DstackError, NotFound
from instances.models import Fleet
from instances.services import fleets
from muster import crypto
from muster.crypto import DecryptError
from projects.models import Project
from runs.configuration import parse_fleet_configuration

SEAL_PREFIX = "muster-sealed:"
SEAL_SECONDS = 3600


def _seal(private: str, user, project: Project) -> str:
    body = json.dumps({"u": user.pk, "p": project.pk, "t": time.time(), "k": private})
    return SEAL_PREFIX + crypto.encrypt(body)


def _unseal(sealed: str, user, project: Project) -> str:
    try:
        body = json.loads(crypto.decrypt(sealed[len(SEAL_PREFIX):]))
    except (DecryptError, ValueError):
        body = None
    if not isinstance(body, dict) or body.get("u") != user.pk or body.get("p") != project.pk \
            or time.time() - float(body.get("t", 0)) > SEAL_SECONDS:
        raise DstackError("ssh_config.ssh_key: the plan this key came from is not yours or is over an hour old: "
                          "run `dstack apply` again")
    return body["k"]


def _map_keys(value: Any, change) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "ssh_key" and isinstance(v, dict) and isinstance(v.get("private"), str):
                out[k] = {**v, "private": change(v["private"])}
            else:
                out[k] = _map_keys(v, change)
        return out
    if isinstance(value, list):
        return [_map_keys(v, change) for v in value]
    return value


def _fleet(project: Project, name: Any) -> Fleet:
    fleet = Fleet.objects.select_related("project").filter(project=project, name=name).first() \
        if isinstance(name, str) else None
    if fleet is None:
        raise NotFound("Resource not found")
    return fleet


def listed(project: Project) -> list[dict]:
    return [render.fleet_object(f) for f in Fleet.objects.filter(project=project).select_related("project")
            .order_by("name")]


def get(project: Project, name: Any) -> dict:
    return render.fleet_object(_fleet(project, name))


def plan(project: Project, user, spec: dict) -> dict:
    conf = translate.fleet_configuration(spec)  # refuses what has no place before anything is sealed
    parse_fleet_configuration(conf)  # Muster's own 400s, as for a YAML
    current = Fleet.objects.select_related("project").filter(project=project, name=conf.get("name")).first()
    sealed = _map_keys(spec, lambda key: key if key.startswith(SEAL_PREFIX) else _seal(key, user, project))
    return {"project_name": project.name, "user": user.username, "spec": sealed,
            "effective_spec": translate.without_private_keys(spec), "offers": [], "total_offers": 0,
            "current_resource": render.fleet_object(current) if current else None, "action": "create"}


def apply(project: Project, user, spec: dict) -> dict:
    opened = _map_keys(spec, lambda key: _unseal(key, user, project) if key.startswith(SEAL_PREFIX) else key)
    conf = translate.fleet_configuration(opened)
    fleet = fleets.apply_fleet(project, {"configuration": conf}, actor=user.username, user=user)
    return render.fleet_object(Fleet.objects.select_related("project").get(pk=fleet.pk))


def delete(project: Project, user, names: list[str]) -> None:
    found = [_fleet(project, name) for name in names]  # all found, or nothing deleted
    for fleet in found:
        fleets.delete_fleet(fleet, actor=user.username)


def delete_instances(project: Project, user, name: str, instance_nums: list[int]) -> None:
    fleets.delete_instances(_fleet(project, name), instance_nums, actor=user.username)
