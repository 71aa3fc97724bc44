"""Backend name -> Compute class. Imports are lazy so a missing optional dependency stays local."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from backends.base import Compute

# The product's backends: name -> Compute class. A deployment adds its own by settings
# (MUSTER["EXTRA_BACKENDS"], same shape; the benchmarks' hollow instances come that way).
BACKENDS = {
    "local": "backends.local.compute.LocalCompute",
    "ssh": "backends.ssh.compute.SSHCompute",
    "gcp": "backends.gcp.compute.GcpTpuCompute",
}


def compute_class(name: str) -> type[Compute]:
    path = BACKENDS.get(name) or settings.MUSTER["EXTRA_BACKENDS"].get(name)
    if path is None:
        raise ValueError(f"unknown backend {name!r}")
    return import_string(path)


def get_compute(name: str, config: dict[str, Any] | None = None) -> Compute:
    return compute_class(name)(config)


def load_every_backend() -> None:
    """Import every backend a fleet may name, the deployment's own too (muster/warm.py)."""
    for name in {**settings.MUSTER["EXTRA_BACKENDS"], **BACKENDS}:
        compute_class(name)


def creates_groups(backend: str) -> bool:
    """Static fleets (local, ssh, hollow) hold registered hosts; group-creating ones make them."""
    return get_compute(backend).creates_groups


def compute_for_instance(instance) -> Compute:
    fleet = instance.fleet
    if fleet is None and instance.group_id is not None:
        return get_compute(instance.backend, group_backend_config(instance.group))
    return get_compute(instance.backend, fleet_backend_config(fleet) if fleet else {})


def fleet_backend_config(fleet) -> dict[str, Any]:
    if fleet.backend == "gcp":
        from django.conf import settings

        from backends.gcp.config import merged

        # the fleet's own zones/spot/runtime_version win over the server-wide GCP settings
        return merged(settings.MUSTER["GCP"], fleet.configuration)
    return {}


def kept_for_group(fleet) -> dict[str, Any]:
    """What a group keeps of its fleet's backend settings when it is made (`backend_data["fleet"]`),
    so that it can still be deleted once the fleet's row is gone: a fleet's deletion removes the row
    before its slices' delete steps run (engine/fleet_deletion.py). Only the fleet's own keys, and
    never a secret: project, credentials and endpoint stay the server's, read at delete time."""
    if fleet.backend == "gcp":
        from backends.gcp.config import kept_settings

        return kept_settings(fleet.configuration)
    return {}


def group_backend_config(group) -> dict[str, Any]:
    """A group's backend settings: its fleet's; for a group whose fleet is gone (`fleet` is SET_NULL),
    the server's settings with what the group kept of its fleet's (an older group kept nothing: the
    server's alone, which delete a slice whose node or request name was recorded)."""
    if group.fleet is not None:
        return fleet_backend_config(group.fleet)
    if group.backend_data.get("backend", "gcp") == "gcp":
        from django.conf import settings

        from backends.gcp.config import with_kept

        return with_kept(settings.MUSTER["GCP"], group.backend_data.get("fleet") or {})
    return {}
