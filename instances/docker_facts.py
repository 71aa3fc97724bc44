"""Whether a host can run jobs with `image`, kept fresh after registration.

Registration probes Docker (backends/ssh/probe.py) and records it as `resources["docker"]`
({version, runtimes}, or None), which placement and `muster instances` read. A host may get
Docker installed later, or lose it (the daemon stopped, the package removed, the user taken out
of the docker group), so the SSH health check (engine/ssh_health.py) probes Docker again on a
host it reaches, at most once per SSH_DOCKER_PROBE_INTERVAL seconds (default 300) per host: one
`docker info` over the connection the check already has. A change updates the resources and is
recorded as an event of the instance; the next placement uses it. A probe that fails (a hung
daemon past its timeout, the connection dropped meanwhile) changes nothing and is tried again
at the next check.

The probe itself is host I/O, so the engine makes it (engine/ssh_health.py); this module keeps
what it found. The local backend's machine is looked at when a run with `image` is planned or submitted
(runs/services/local_images.py) and recorded the same way on its local instances.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import transaction

from events.services import record
from instances.models import Instance

log = logging.getLogger(__name__)

UNCHANGED = object()  # not probed this time (not due, or the probe failed)


def interval() -> float:
    return float(settings.MUSTER["SSH_DOCKER_PROBE_INTERVAL"])


def due(instance: Instance, now: float | None = None) -> bool:
    probed = (instance.backend_data or {}).get("docker_probed_at")
    now = time.time() if now is None else now
    return not isinstance(probed, int | float) or now - probed >= interval()


def describe(docker: dict | None) -> str:
    if not docker:
        return "no Docker"
    runtimes = ", ".join(docker.get("runtimes") or []) or "none listed"
    return f"Docker {docker.get('version')} (runtimes: {runtimes})"


def store(instance: Instance, found: Any) -> bool:
    """Record what `probe` found (on the caller's database connection). True when it changed."""
    if found is UNCHANGED:
        return False
    with transaction.atomic():
        row = Instance.objects.select_for_update().filter(pk=instance.pk).only("resources", "backend_data").first()
        if row is None:
            return False
        resources = dict(row.resources or {})
        before = resources.get("docker")
        changed = before != found
        fields = {"backend_data": {**(row.backend_data or {}), "docker_probed_at": time.time()}}
        if changed:
            fields["resources"] = {**resources, "docker": found}
        Instance.objects.filter(pk=instance.pk).update(**fields)
        if changed:
            record(instance.project_id, f"instance {instance.name}", _change(before, found),
                   status=instance.status, instance_id=instance.pk)
    instance.backend_data = fields["backend_data"]
    if changed:
        instance.resources = fields["resources"]
    return changed


def _change(before: dict | None, after: dict | None) -> str:
    if before and not after:
        return "Docker no longer answers: jobs with `image` are not placed here until it does"
    if after and not before:
        return f"{describe(after)} found: jobs with `image` can run here"
    return f"Docker changed: {describe(before)} -> {describe(after)}"
