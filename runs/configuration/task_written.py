"""`type: task` as written: the strict input models that read a task document and its groups.

These are the field-level rules (types, names, durations, retry) that pydantic checks key by key;
the rules that span keys or groups are in `task_groups` and `task`. Kept apart from the checked
form (`task_checked`) so the two shapes of a task, what a user writes and what the engine runs,
are each read in one place.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import field_validator

from . import dialect
from .durations import parse_duration, parse_optional_duration
from .fields import Port, WrittenModel, check_group_name, check_slug
from .images import check_image

DEFAULT_RETRY_DURATION = 3600
# Slices of one multislice set. Node ids are `<pod>-s-<i>` within Google's 63 characters.
# "whole-set": a lost slice ends the set (xpk/JobSet); "replace-slice": only it is made again
SliceFailure = Literal["whole-set", "replace-slice"]
MAX_SLICES = 256  # seconds; `retry: true` and a retry without `duration`

StartupOrder = Literal["any", "master-first", "workers-first"]
StopCriteria = Literal["all-done", "master-done"]
RetryEvent = Literal["no-capacity", "interruption", "error"]
RETRY_EVENTS: tuple[str, ...] = get_args(RetryEvent)


class _RetryInput(WrittenModel):
    on_events: list[RetryEvent] = list(RETRY_EVENTS)  # type: ignore[assignment]
    duration: Any = DEFAULT_RETRY_DURATION

    @field_validator("on_events")
    @classmethod
    def _some_events(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("list at least one event (no-capacity, interruption, error) or set retry: false")
        return list(dict.fromkeys(value))

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: object) -> int:
        return parse_duration(value)


class _GroupShape(WrittenModel):
    """Checks that apply alike to the top level of a task and to each of its groups."""

    @field_validator("nodes", check_fields=False)
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("nodes must be at least 1")
        return value

    @field_validator("slices", check_fields=False)
    @classmethod
    def _slices(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= MAX_SLICES:
            raise ValueError(f"slices must be from 1 to {MAX_SLICES}")
        return value

    @field_validator("image", check_fields=False)
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return check_image(value)


class _GroupInput(_GroupShape):
    name: str | None = None  # dstack's default: the group's index, "0", "1", ...
    nodes: int | None = None
    slices: int | None = None  # Muster's own: a multislice set of this many TPU slices
    # Muster's own: what one lost slice of the set means (task_groups.check_slice_failure)
    on_slice_failure: SliceFailure | None = None
    resources: Any = None
    commands: list[str] = []
    env: Any = None
    image: str | None = None
    ports: list[Port] = []
    fleets: list[str] = []  # the group's own choice among the task's fleets (a run may span fleets)
    # read and checked key by key in `readiness` (each problem named with its place)
    probes: Any = []
    ready_timeout: Any = None
    depends_on: Any = []
    on_failure: Any = None  # runs/configuration/failure_policy.py reads both
    max_restarts: Any = None

    @field_validator("name")
    @classmethod
    def _group_name(cls, value: str | None) -> str | None:
        return check_group_name(value)

    @field_validator("fleets")
    @classmethod
    def _group_fleet_names(cls, value: list[str]) -> list[str]:
        return fleet_names(value)


class _TaskInput(_GroupShape, dialect.ContainerKeys, dialect.ProfileKeys):
    type: Literal["task"] = "task"
    name: str | None = None
    nodes: int | None = None
    slices: int | None = None
    on_slice_failure: SliceFailure | None = None  # a `nodes:` task's one group; per group with `groups`
    groups: list[dict[str, Any]] | None = None
    image: str | None = None
    env: Any = None
    commands: list[str] = []
    ports: list[Port] = []
    resources: Any = None
    probes: Any = []  # a `nodes:` task's one group; read in `readiness`
    ready_timeout: Any = None
    startup_order: StartupOrder = "any"
    stop_criteria: StopCriteria = "all-done"
    retry: _RetryInput | None = None
    max_duration: Any = None
    fleets: list[str] = []
    setup: list[str] = []
    on_failure: Any = None  # a `nodes:` task's one group; per group with `groups`
    max_restarts: Any = None

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str | None) -> str | None:
        return check_slug(value)

    @field_validator("retry", mode="before")
    @classmethod
    def _retry_switch(cls, value: object) -> object:
        # `retry: true` is the default policy; `retry: false` is none.
        if value is True:
            return {}
        if value is False:
            return None
        return value

    @field_validator("max_duration")
    @classmethod
    def _max_duration(cls, value: object) -> int | None:
        # dstack: `true` is the default (no limit for a task), `false` the same as `off`
        return None if value is None or value is True else parse_optional_duration(value)

    @field_validator("fleets")
    @classmethod
    def _fleet_names(cls, value: list[str]) -> list[str]:
        return fleet_names(value)


def fleet_names(value: list[str]) -> list[str]:
    if any(not name.strip() for name in value):
        raise ValueError("a fleet name cannot be empty")
    return list(dict.fromkeys(value))


