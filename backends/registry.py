"""Backend name -> Compute class. Imports are lazy so a missing optional dependency stays local."""

from __future__ import annotations

from typing import Any

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
    raise ValueError(f"unknown backend {name!r}")


def compute_for_instance(instance) -> Compute:
    fleet = instance.fleet
    return get_compute(instance.backend, fleet_backend_config(fleet) if fleet else {})


def fleet_backend_config(fleet) -> dict[str, Any]:
    if fleet.backend == "gcp":
        from django.conf import settings

        return {**settings.MUSTER.get("GCP", {}), **fleet.configuration.get("gcp", {})}
    return {}
