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
    return get_compute(instance.backend, fleet_backend_config(fleet) if fleet else {})


def fleet_backend_config(fleet) -> dict[str, Any]:
    if fleet.backend == "gcp":
        from django.conf import settings

        from backends.gcp.config import merged

        # the fleet's own zones/spot/runtime_version win over the server-wide GCP settings
        return merged(settings.MUSTER["GCP"], fleet.configuration)
    return {}
