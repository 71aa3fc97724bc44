"""Backend name -> Compute class. Imports are lazy so a missing optional dependency stays local."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from backends.base import Compute


def get_compute(name: str, config: dict[str, Any] | None = None) -> Compute:
    if name == "local":
        from backends.local.compute import LocalCompute

        return LocalCompute(config)
    if name == "ssh":
        from backends.ssh.compute import SSHCompute

        return SSHCompute(config)
    if name == "gcp":
        from backends.gcp.compute import GcpTpuCompute

        return GcpTpuCompute(config)
    extra = _extra_backends().get(name)
    if extra is not None:
        return extra(config)
    raise ValueError(f"unknown backend {name!r}")


def _extra_backends() -> dict[str, type[Compute]]:
    """Backends a deployment adds by settings (MUSTER["EXTRA_BACKENDS"]: name -> dotted class path).

    The benchmarks use this for their hollow instances; the product's own backends are above.
    """
    from django.utils.module_loading import import_string

    return {name: import_string(path) for name, path in settings.MUSTER["EXTRA_BACKENDS"].items()}


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
