"""A new replica's stored spec from a service run's stored configuration (the engine's scale-up and
rolling update make replicas long after the submit): the stored dict checked again as the service
it was made from, then expansion.replica_spec, so a new replica is exactly what the submit makes."""

from __future__ import annotations

from typing import Any

from .expansion import replica_spec
from .service import ServiceConfiguration
from .stored import SERVER_KEYS


def new_replica_spec(configuration: dict, group_name: str, replica_num: int, job_num: int) -> dict[str, Any]:
    checked = ServiceConfiguration.model_validate({k: v for k, v in configuration.items() if k not in SERVER_KEYS})
    return replica_spec(checked, group_name, replica_num, job_num)
