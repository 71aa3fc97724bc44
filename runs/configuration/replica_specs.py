"""A new replica's stored specs (one per node) from a service run's stored configuration (the engine's scale-up and
rolling update make replicas long after the submit): the stored dict checked again as the service
it was made from, then expansion.replica_specs, so a new replica is exactly what the submit makes."""

from __future__ import annotations

from typing import Any

from .expansion import replica_specs
from .service import ServiceConfiguration
from .stored import SERVER_KEYS


def new_replica_specs(configuration: dict, group_name: str, replica_num: int, job_num: int) -> list[dict[str, Any]]:
    checked = ServiceConfiguration.model_validate({k: v for k, v in configuration.items() if k not in SERVER_KEYS})
    return replica_specs(checked, group_name, replica_num, job_num)
