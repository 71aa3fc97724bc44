"""`type: task`: from the written configuration to a checked, normalized TaskConfiguration.

Each group is defaulted and validated exactly like the top level of a `nodes:` task (which is
one implicit group named `default`), so a rule cannot apply to one and silently skip the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from . import dialect
from .documents import load_document
from .durations import parse_duration, parse_optional_duration
from .envs import parse_env, resolve_env
from .errors import ConfigurationError, ErrorList, format_loc
from .fields import Port, WrittenModel, check_group_name, check_slug, read_model_partially
from .interpolation import reference_problems, secret_names, substitute_run_args, substitute_secrets
from .resources import SHM_WITHOUT_IMAGE, ProbedNames, Resources, Warnings, parse_resources

DEFAULT_MAX_NODES = 4096
IMPLICIT_GROUP_NAME = "default"
DEFAULT_RETRY_DURATION = 3600  # seconds; `retry: true` and a retry without `duration`
# Keys a task may not have at the top level once it has groups: each group says its own.
PER_GROUP_KEYS = ("commands", "ports", "resources")

StartupOrder = Literal["any", "master-first", "workers-first"]
StopCriteria = Literal["all-done", "master-done"]
RetryEvent = Literal["no-capacity", "interruption", "error"]
RETRY_EVENTS: tuple[str, ...] = get_args(RetryEvent)


# ---- the written form -------------------------------------------------------------------------


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


class _GroupInput(_GroupShape):
    name: str | None = None  # dstack's default: the group's index, "0", "1", ...
    nodes: int | None = None
    resources: Any = None
    commands: list[str] = []
    env: Any = None
    image: str | None = None
    ports: list[Port] = []

    @field_validator("name")
    @classmethod
    def _group_name(cls, value: str | None) -> str | None:
        return check_group_name(value)


class _TaskInput(_GroupShape, dialect.ContainerKeys, dialect.ProfileKeys):
    type: Literal["task"] = "task"
    name: str | None = None
    nodes: int | None = None
    groups: list[dict[str, Any]] | None = None
    image: str | None = None
    env: Any = None
    commands: list[str] = []
    ports: list[Port] = []
    resources: Any = None
    startup_order: StartupOrder = "any"
    stop_criteria: StopCriteria = "all-done"
    retry: _RetryInput | None = None
    max_duration: Any = None
    fleets: list[str] = []
    setup: list[str] = []

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
        if any(not name.strip() for name in value):
            raise ValueError("a fleet name cannot be empty")
        return value


# ---- the checked form -------------------------------------------------------------------------


class _Checked(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryPolicy(_Checked):
    on_events: list[RetryEvent]
    duration: int  # seconds, counted from submission


class NodeGroup(_Checked):
    """One group as the engine runs it: its own resources, and env/image already merged."""

    name: str
    index: int
    nodes: int
    resources: Resources
    commands: list[str]
    env: dict[str, str]
    image: str | None
    ports: list[int | str]


class TaskConfiguration(_Checked):
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


# ---- parsing ----------------------------------------------------------------------------------


@dataclass
class _Part:
    """A group, or the top level of a `nodes:` task, on its way to a NodeGroup."""

    loc: list[str | int]
    name: str
    nodes: int | None
    resources: Resources | None
    commands: list[str]
    env: dict[str, str | None]
    image: str | None
    ports: list[int | str]


def parse_run_configuration(
    data: str | dict,
    *,
    env_values: dict[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    max_nodes: int = DEFAULT_MAX_NODES,
    run_args: str = "",
    probed_gpu_names: ProbedNames | None = None,
) -> TaskConfiguration:
    """Check a task configuration and return it normalized; ConfigurationError lists every problem.

    Every check runs even when an earlier one failed (a key with a problem is left out of the
    later checks), so one 400 names all the problems of the document.
    """
    document = load_document(data)
    errors = ErrorList()
    warnings: Warnings = []
    task, bad = read_model_partially(_TaskInput, document, [], errors)
    if task is None:
        task = _TaskInput.model_validate({})
        bad = {str(k) for k in document}
    written_env = parse_env(task.env, errors, ["env"])
    dialect.check_task_keys(task, errors, warnings)
    parts = _read_parts(task, document, bad, errors, warnings, probed_gpu_names)
    if dialect.has_image(task):  # shm_size takes effect: the jobs run in containers
        warnings[:] = [w for w in warnings if SHM_WITHOUT_IMAGE not in w["message"]]

    if parts is not None and task.groups is not None:
        _check_group_layout(task, parts, errors)
    readable = [p for p in parts or [] if p is not None]
    for part in readable:
        _warn_part(part, warnings)
    env_values = env_values or {}
    # not `secrets or {}`: truth-testing a lazy mapping would read the secrets of every submit
    secrets = {} if secrets is None else secrets
    written_env = _fill_env(written_env, run_args, secrets, errors, ["env"])
    top_env = resolve_env(written_env, env_values, secrets, errors, ["env"])
    groups = [
        _check_part(part, i, task, top_env, env_values, secrets, run_args, errors)
        for i, part in enumerate(parts or [])
        if part is not None
    ]
    total = sum(g.nodes for g in groups if g is not None)
    if total > max_nodes:
        errors.add(
            ["groups"] if task.groups is not None else ["nodes"],
            f"the task has {total} nodes; the limit is {max_nodes}",
        )
    if parts is not None and len(readable) == len(parts):
        # group indexes are only meaningful when every group could be read
        _check_references(task, written_env, readable, groups, errors)
    errors.raise_if_any()
    return TaskConfiguration(
        name=task.name,
        image=task.image,
        env=top_env,
        startup_order=task.startup_order,
        stop_criteria=task.stop_criteria,
        retry=RetryPolicy(on_events=task.retry.on_events, duration=task.retry.duration)
        if task.retry
        else None,
        max_duration=task.max_duration,
        fleets=task.fleets,
        nodes=total,
        groups=[g for g in groups if g is not None],
        uses_groups=task.groups is not None,
        container=dialect.container_values(task),
        registry_password=task.registry_auth.password if task.registry_auth is not None else None,
        profile=dialect.profile_values(task),
        warnings=[{"field": format_loc(w["field"]), "message": w["message"]} for w in warnings],
    )


def _read_parts(
    task: _TaskInput,
    document: dict,
    bad: set[str],
    errors: ErrorList,
    warnings: Warnings,
    probed: ProbedNames | None,
) -> list[_Part | None] | None:
    """Structural reading of the top level or of each group: every error of that kind at once.

    None when the layout itself cannot be read (then the checks that need it are skipped); a
    group that cannot be read is None in the list.
    """
    if "groups" in bad:
        # Still read what can be read, so a bad key does not hide a typo elsewhere.
        written = document.get("groups")
        if isinstance(written, list):
            for i, raw in enumerate(written):
                if isinstance(raw, dict):
                    _read_group(raw, i, task, errors, warnings, probed)
        return None
    if task.groups is None:
        # The top level is the one implicit group; its env is the top-level env, merged in later.
        return [
            _Part(
                loc=[],
                name=IMPLICIT_GROUP_NAME,
                nodes=task.nodes,
                resources=_read_resources(task.resources, ["resources"], errors, warnings, probed),
                commands=[*task.setup, *task.commands],
                env={},
                image=task.image,
                ports=task.ports,
            )
        ]
    return [_read_group(raw, i, task, errors, warnings, probed) for i, raw in enumerate(task.groups)]


def _fill_env(
    env: dict[str, str | None], run_args: str, secrets: Mapping[str, str], errors: ErrorList, loc: list[str | int]
) -> dict[str, str | None]:
    """`${{ run.args }}` and dstack's `${{ secrets.NAME }}` filled in env values."""
    filled: dict[str, str | None] = {}
    for key, value in env.items():
        if value is None:
            filled[key] = None
            continue
        value = substitute_run_args(value, run_args)
        missing = [name for name in secret_names(value) if name not in secrets]
        for name in missing:
            errors.add([*loc, key], f"secret `{name}` does not exist in this project: create it or pass {key} "
                       "with the run")
        filled[key] = value if missing else substitute_secrets(value, secrets)
    return filled


def _warn_part(part: _Part, warnings: Warnings) -> None:
    if part.ports:
        warnings.append({"field": [*part.loc, "ports"], "message": (
            f"ports: {', '.join(str(p) for p in part.ports)} are kept with each job but not forwarded: "
            "reach them on the node's own address (DSTACK_NODE_IP)")})


def _read_group(
    raw: dict, index: int, task: _TaskInput, errors: ErrorList, warnings: Warnings, probed: ProbedNames | None
) -> _Part | None:
    loc: list[str | int] = ["groups", index]
    group, bad = read_model_partially(_GroupInput, raw, loc, errors)
    if group is None:
        return None
    resources = _read_resources(group.resources, [*loc, "resources"], errors, warnings, probed)
    if bad:
        return None
    return _Part(
        loc=loc,
        name=group.name if group.name is not None else str(index),
        nodes=group.nodes,
        resources=resources,
        commands=[*task.setup, *group.commands],
        env=parse_env(group.env, errors, [*loc, "env"]),
        image=group.image,
        ports=group.ports,
    )


def _read_resources(
    raw: object, loc: list[str | int], errors: ErrorList, warnings: Warnings, probed: ProbedNames | None
) -> Resources | None:
    try:
        found: Warnings = []
        resources = parse_resources(raw, warnings=found, probed_gpu_names=probed)
    except ConfigurationError as exc:
        errors.extend_from(exc, loc)
        return None
    warnings.extend({"field": [*loc, *w["field"]], "message": w["message"]} for w in found)
    return resources


def _check_group_layout(task: _TaskInput, parts: list[_Part | None], errors: ErrorList) -> None:
    if task.nodes is not None:
        errors.add(["nodes"], "`nodes` and `groups` cannot be used together: set `nodes` in each group")
    for key in PER_GROUP_KEYS:
        if key in task.model_fields_set:
            errors.add([key], f"top-level `{key}` cannot be used with `groups`: set them per group")
    if not parts:
        errors.add(["groups"], "`groups` must list at least one group")
    first_use: dict[str, int] = {}
    for i, part in enumerate(parts):
        if part is None:
            continue
        if part.name in first_use:
            errors.add(
                [*part.loc, "name"],
                f"group name `{part.name}` is already used by groups[{first_use[part.name]}]",
            )
        first_use.setdefault(part.name, i)


def _check_part(
    part: _Part,
    index: int,
    task: _TaskInput,
    top_env: dict[str, str],
    env_values: Mapping[str, str],
    secrets: Mapping[str, str],
    run_args: str,
    errors: ErrorList,
) -> NodeGroup | None:
    """Defaults and rules of one group (or of a `nodes:` task); None when it has errors."""
    before = len(errors.items)
    image = part.image if part.image is not None else task.image
    resources = part.resources
    nodes = part.nodes
    gpu = resources.gpu if resources else None
    if gpu is not None and gpu.vendor in ("amd", "intel") and not image:
        errors.add(
            [*part.loc, "resources", "gpu"],
            f"{gpu.vendor} GPUs need a container image with their drivers: set `image`"
            + (" on the group or at the top level" if part.loc else ""),
        )
    shape = gpu.tpu_shape() if gpu is not None else None
    if shape is not None:
        if nodes is None:
            nodes = shape.hosts
        elif nodes != shape.hosts:
            errors.add(
                [*part.loc, "nodes"],
                f"{shape.name} has {shape.hosts} host{'s' if shape.hosts != 1 else ''}: "
                f"set nodes: {shape.hosts} or leave nodes out",
            )
    if nodes is None:
        nodes = 1
    own_env = _fill_env(part.env, run_args, secrets, errors, [*part.loc, "env"])
    env = top_env | resolve_env(own_env, env_values, secrets, errors, [*part.loc, "env"])
    if len(errors.items) > before or resources is None:
        return None
    return NodeGroup(
        name=part.name,
        index=index,
        nodes=nodes,
        resources=resources,
        commands=[substitute_run_args(c, run_args) for c in part.commands],
        env=env,
        image=image,
        ports=part.ports,
    )


def _check_references(
    task: _TaskInput,
    written_env: dict[str, str | None],
    parts: list[_Part],
    groups: list[NodeGroup | None],
    errors: ErrorList,
) -> None:
    """Every `${{ }}` in commands and env must name an existing node's IP_ADDRESS."""
    sizes: list[tuple[str, int | None]] | None = None
    if task.groups is not None:
        sizes = [(p.name, g.nodes if g is not None else p.nodes) for p, g in zip(parts, groups, strict=True)]
    places: list[tuple[list[str | int], str, bool]] = []  # (loc, text, secrets allowed)
    places += [(["env", key], value, True) for key, value in written_env.items() if value is not None]
    for part in parts:
        places += [([*part.loc, "commands", c], command, False) for c, command in enumerate(part.commands)]
        places += [([*part.loc, "env", k], v, True) for k, v in part.env.items() if v is not None]
    for loc, text, secrets_allowed in places:
        for problem in reference_problems(text, sizes, secrets_allowed):
            errors.add(loc, problem)
