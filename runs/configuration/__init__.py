"""The run and fleet configuration language: parsing, checking, expansion into jobs, matching.

Pure Python (pydantic + PyYAML, no Django), so it can be used and tested on its own.
"""

from __future__ import annotations

from typing import Any

from .documents import load_document
from .durations import parse_duration
from .errors import ConfigurationError
from .expansion import JobSpec, expand_jobs, group_requirements, stored_specs
from .fleet import FleetConfiguration, parse_fleet_configuration
from .interpolation import ip_references, substitute_ips
from .matching import fits, gpu_count_for
from .requirements import Resources
from .resources import parse_resources
from .service import ServiceConfiguration, ServiceGroup, parse_service_configuration
from .task import parse_run_configuration
from .task_checked import NodeGroup, RetryPolicy, TaskConfiguration

CONFIGURATION_TYPES = ("task", "service", "fleet")
RUN_TYPES = ("task", "service")


def parse_any_configuration(data: str | dict, **kwargs: Any) -> TaskConfiguration | FleetConfiguration:
    """Parse a task, a service or a fleet, chosen by its `type`; keyword arguments go to the run parser."""
    document = load_document(data)
    kind = document.get("type")
    if kind == "task":
        return parse_run_configuration(document, **kwargs)
    if kind == "service":
        return parse_service_configuration(document, **kwargs)
    if kind == "fleet":
        return parse_fleet_configuration(document)
    if kind is None:
        msg = "`type` is required: task, service or fleet"
    else:
        msg = f"unknown type `{kind}`: use task, service or fleet"
    raise ConfigurationError([{"loc": ["type"], "msg": msg}])


__all__ = [
    "CONFIGURATION_TYPES",
    "ConfigurationError",
    "FleetConfiguration",
    "JobSpec",
    "NodeGroup",
    "Resources",
    "RUN_TYPES",
    "RetryPolicy",
    "ServiceConfiguration",
    "ServiceGroup",
    "TaskConfiguration",
    "expand_jobs",
    "fits",
    "gpu_count_for",
    "group_requirements",
    "ip_references",
    "load_document",
    "parse_any_configuration",
    "parse_duration",
    "parse_fleet_configuration",
    "parse_resources",
    "parse_run_configuration",
    "parse_service_configuration",
    "stored_specs",
    "substitute_ips",
]
