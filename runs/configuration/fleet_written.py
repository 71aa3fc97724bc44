"""`type: fleet` as written: the strict input models for SSH fleets and cloud fleets.

Field-level rules only (types, ports, durations, dstack's keys read with its types); what a key
means for the fleet as a whole is decided in `fleet`. Kept apart like `task_written`, so what a
user may write and what Muster keeps are each read in one place.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, field_validator

from backends.registry import compute_class, fleet_backend

from .container_policy import check_prefix
from .dialect import SpotPolicy, TerminationPolicy, check_backends, check_max_price
from .durations import parse_duration, parse_optional_duration
from .fields import WrittenModel, check_slug
from .ranges import parse_count_range

Placement = Literal["any", "cluster"]


class _HostInput(WrittenModel):
    hostname: str
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    private_key: str | None = None
    host_key: str | None = None

    @field_validator("hostname")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("hostname cannot be empty")
        return value.strip()

    @field_validator("port")
    @classmethod
    def _port(cls, value: int | None) -> int | None:
        return _check_ssh_port(value)


class _SSHInput(WrittenModel):
    user: str | None = None
    identity_file: str | None = None
    private_key: str | None = None
    port: int | None = None
    hosts: list[_HostInput]

    @field_validator("hosts", mode="before")
    @classmethod
    def _bare_hostnames(cls, value: object) -> object:
        # `- 10.0.0.5` is shorthand for `- hostname: 10.0.0.5`.
        if isinstance(value, list):
            return [{"hostname": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("hosts")
    @classmethod
    def _some_hosts(cls, value: list[_HostInput]) -> list[_HostInput]:
        if not value:
            raise ValueError("list at least one host")
        return value

    @field_validator("port")
    @classmethod
    def _port(cls, value: int | None) -> int | None:
        return _check_ssh_port(value)


class _VolumePolicyInput(WrittenModel):
    # checked one by one, so an error points at the list item
    allowed_prefixes: list[Annotated[str, AfterValidator(check_prefix)]] = []


class _FleetInput(WrittenModel):
    type: Literal["fleet"] = "fleet"
    name: str | None = None  # required by Muster (dstack generates one); checked below
    placement: Placement = "any"
    ssh_config: _SSHInput | None = None
    backends: list[str] | None = None
    nodes: Any = None
    resources: Any = None
    spot: bool = False
    zones: list[str] = []
    regions: list[str] = []
    idle_duration: Any = None
    runtime_version: str | None = None
    # Muster's: what the runs' containers may do to the hosts (container_policy)
    allow_privileged: bool | None = None
    volumes: _VolumePolicyInput | None = None
    queued_resource: Any = None  # Muster's own (gcp): `true` or {valid_until: DURATION}
    # Muster's own: sharing the fleet with other projects (checked in fleet_shares)
    quota: Any = None
    borrowing_limit: Any = None
    shared_with: Any = None
    # dstack's other fleet keys: read with its types; each written one takes effect or warns
    env: Any = None
    spot_policy: SpotPolicy | None = None
    availability_zones: list[str] | None = None
    instance_types: list[str] | None = None
    reservation: str | None = None
    blocks: Any = None
    retry: Any = None
    max_price: float | None = None
    stop_duration: Any = None
    termination_policy: TerminationPolicy | None = None
    termination_idle_time: Any = None
    tags: dict[str, str] | None = None

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str | None) -> str | None:
        check_slug(value)
        return value

    @field_validator("backends")
    @classmethod
    def _some_backends(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("list at least one backend (gcp or local)")
        value = check_backends(value)
        if value is not None and any(compute_class(fleet_backend([b])).given_hosts for b in value):
            raise ValueError("an ssh fleet is written with `ssh_config` (its hosts), not `backends`")
        return value

    @field_validator("blocks")
    @classmethod
    def _blocks(cls, value: object) -> object:
        if value is None or value == "auto" or (type(value) is int and value >= 1):
            return value
        raise ValueError("blocks must be `auto` or a whole number of at least 1")

    @field_validator("retry")
    @classmethod
    def _retry(cls, value: object) -> object:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, dict) and set(value) <= {"on_events", "duration"}:
            if value.get("duration") is not None:
                parse_duration(value["duration"])
            return value
        raise ValueError("retry must be true, false or a mapping with on_events and duration")

    @field_validator("queued_resource")
    @classmethod
    def _queued(cls, value: object) -> dict[str, int | None] | None:
        return check_queued_resource(value)

    @field_validator("reservation")
    @classmethod
    def _reservation(cls, value: str | None) -> str | None:
        if value is not None and not _RESERVATION.fullmatch(value):
            raise ValueError("reservation is a reservation's name (e.g. r1) or its full name "
                             "projects/PROJECT/locations/ZONE/reservations/NAME")
        return value

    @field_validator("max_price")
    @classmethod
    def _price(cls, value: float | None) -> float | None:
        return check_max_price(value)

    @field_validator("stop_duration", "termination_idle_time")
    @classmethod
    def _other_durations(cls, value: object) -> object:
        return None if value is None or value is True else parse_optional_duration(value)

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: object) -> tuple[int | None, int | None] | None:
        return None if value is None else parse_count_range(value, "nodes")

    @field_validator("idle_duration")
    @classmethod
    def _idle(cls, value: object) -> object:
        return None if value is None else parse_optional_duration(value)


# Google fails a queued request that is still waiting when its valid_until is over; Muster asks
# for at most this long per zone, so a request never outlives what a fleet can reasonably mean.
MAX_VALID_UNTIL = 30 * 86400
_RESERVATION = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?|projects/[^/\s]+/locations/[^/\s]+/reservations/[^/\s]+")


# Flex-start (Google's Dynamic Workload Scheduler through queued resources) gives a slice for at
# most 7 days (cloud.google.com/tpu/docs/request-using-flex-start, "Limitations").
MAX_FLEX_RUN = 7 * 86400
FLEX_START = "flex-start"
_QUEUED_KEYS = {"valid_until", "provisioning_model", "max_run_duration"}


def check_queued_resource(value: object) -> dict[str, Any] | None:
    """`queued_resource` as written -> None (off) or {"valid_until": seconds or None} plus, for
    flex-start, {"provisioning_model": "flex-start", "max_run_duration": seconds}."""
    if value is None or value is False:
        return None
    if value is True:
        return {"valid_until": None}
    if isinstance(value, dict) and set(value) <= _QUEUED_KEYS:
        written = value.get("valid_until")
        seconds = None if written is None else parse_duration(written)
        if seconds is not None and not 1 <= seconds <= MAX_VALID_UNTIL:
            raise ValueError(f"valid_until {written} is out of range: Google queues a request for at most "
                             f"30d (write e.g. valid_until: 2h, or leave it out for no limit)")
        return {"valid_until": seconds, **_flex(value)}
    raise ValueError("queued_resource must be true, false or a mapping with valid_until, provisioning_model "
                     "and max_run_duration (e.g. {valid_until: 2h} or {provisioning_model: flex-start, "
                     "max_run_duration: 1d})")


def _flex(value: dict) -> dict[str, Any]:
    model = value.get("provisioning_model")
    run = value.get("max_run_duration")
    if model is None and run is None:
        return {}
    if model != FLEX_START:
        raise ValueError(f"provisioning_model must be {FLEX_START} (the only one a queued resource takes "
                         f"besides the default), not {model!r}" if model is not None else
                         f"max_run_duration is for provisioning_model: {FLEX_START}: add it, or remove max_run_duration")
    if run is None:
        raise ValueError(f"provisioning_model: {FLEX_START} needs max_run_duration (how long the slice is "
                         "yours once given, at most 7d), e.g. max_run_duration: 1d")
    seconds = parse_duration(run)
    if seconds is None or not 1 <= seconds <= MAX_FLEX_RUN:
        raise ValueError(f"max_run_duration {run} is out of range: flex-start gives a slice for at most 7d")
    return {"provisioning_model": FLEX_START, "max_run_duration": seconds}


def _check_ssh_port(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= 65535:
        raise ValueError(f"port {value} is out of range (1..65535)")
    return value

