"""`type: task` as checked: the normalized TaskConfiguration the engine runs, with its groups.

What the parser returns and what is stored with a run; kept apart from the parser so code that
only reads a configuration (expansion into jobs, the engine) does not depend on how it was read.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .failure_policy import DEFAULT_MAX_RESTARTS, FailureRule
from .fields import CheckedModel
from .readiness import DEFAULT_READY_TIMEOUT, Dependency, Probe
from .requirements import Resources
from .task_written import RetryEvent, StartupOrder, StopCriteria


class RetryPolicy(CheckedModel):
    on_events: list[RetryEvent]
    duration: int  # seconds: from submission for no-capacity, else from the last failure


class NodeGroup(CheckedModel):
    """One group as the engine runs it: its own resources, and env/image already merged."""

    name: str
    index: int
    nodes: int
    resources: Resources
    commands: list[str]
    env: dict[str, str]
    image: str | None
    ports: list[int | str]
    fleets: list[str] = []  # the group's own `fleets:`; empty: any fleet the task may use
    # TPU slices of a multislice set (1: one slice, or no TPU); nodes = slices x hosts per slice.
    slices: int = 1
    # what one lost slice of the set means: "whole-set" (the set goes) or "replace-slice"
    on_slice_failure: str = "whole-set"
    probes: list[Probe] = Field(default_factory=list)  # none: ready once running
    ready_timeout: int = DEFAULT_READY_TIMEOUT  # seconds from running to ready
    depends_on: list[Dependency] = Field(default_factory=list)
    on_failure: list[FailureRule] = []  # empty: the run's retry, else fail-run
    max_restarts: int = DEFAULT_MAX_RESTARTS


class TaskConfiguration(CheckedModel):
    """A checked task, normalized for the engine.

    Bare env keys are already filled from the passed values or secrets, so `env` (here and in
    each group) may hold secret values: store and show it accordingly.
    """

    type: Literal["task"] = "task"
    name: str | None
    image: str | None
    env: dict[str, str]  # the top-level env, resolved; each group carries its merged env
    startup_order: StartupOrder
    stop_criteria: StopCriteria
    retry: RetryPolicy | None
    max_duration: int | None  # seconds; None = no limit
    fleets: list[str]
    nodes: int  # all nodes of the run
    groups: list[NodeGroup]  # a `nodes:` task has one group named `default`
    uses_groups: bool  # False for a `nodes:` task (group references are then invalid)
    # dstack keys kept as written (normalized) that do not change how Muster runs the task yet;
    # each one that was written also has a warning. Registry passwords are never kept here.
    container: dict[str, Any] = {}
    profile: dict[str, Any] = {}
    # What the written configuration asks for that does not take effect here: shown with the
    # plan, not stored with the run.
    warnings: list[dict[str, str]] = Field(default_factory=list, exclude=True)
    # registry_auth's password: never shown nor stored as written (the submission keeps it encrypted)
    registry_password: str | None = Field(default=None, exclude=True, repr=False)


