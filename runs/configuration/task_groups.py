"""A task's groups: reading each one, defaulting it and checking the rules between groups.

Each group is defaulted and validated exactly like the top level of a `nodes:` task (which is
one implicit group named `default`), so a rule cannot apply to one and silently skip the other:
both go through `read_parts` and `check_part` here. Also here: env values filled from run args
and secrets, the layout rules of `groups:` and the `${{ }}` references between nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from backends.registry import SliceShape

from .envs import parse_env, resolve_env
from .errors import ConfigurationError, ErrorList
from .failure_policy import read_policy
from .fields import read_model_partially
from .gpu_spec import ProbedNames
from .interpolation import reference_problems, secret_names, substitute_run_args, substitute_secrets
from .readiness import Dependency, Readiness, read_readiness
from .requirements import Resources
from .resources import Warnings, parse_resources
from .task_checked import NodeGroup
from .task_written import _GroupInput, _TaskInput

IMPLICIT_GROUP_NAME = "default"
# Keys a task may not have at the top level once it has groups: each group says its own.
PER_GROUP_KEYS = ("commands", "ports", "resources", "slices", "on_slice_failure", "probes", "ready_timeout", "on_failure",
                  "max_restarts")


@dataclass
class Part:
    """A group, or the top level of a `nodes:` task, on its way to a NodeGroup."""

    loc: list[str | int]
    name: str
    nodes: int | None
    resources: Resources | None
    commands: list[str]
    env: dict[str, str | None]
    image: str | None
    ports: list[int | str]
    fleets: list[str] | None = None
    slices: int | None = None
    on_slice_failure: str | None = None
    readiness: Readiness | None = None  # None: its keys had problems (already reported)
    depends_on: list[Dependency] = field(default_factory=list)  # those that could be read
    on_failure: object = None
    max_restarts: object = None


def read_parts(
    task: _TaskInput,
    document: dict,
    bad: set[str],
    errors: ErrorList,
    warnings: Warnings,
    probed: ProbedNames | None,
) -> list[Part | None] | None:
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
            Part(
                loc=[],
                name=IMPLICIT_GROUP_NAME,
                nodes=task.nodes,
                resources=_read_resources(task.resources, ["resources"], errors, warnings, probed),
                commands=[*task.setup, *task.commands],
                env={},
                image=task.image,
                ports=task.ports,
                slices=task.slices,
                on_slice_failure=task.on_slice_failure,
                readiness=read_readiness(document, [], task.ports, errors, depends_allowed=False)[0],
                on_failure=task.on_failure,
                max_restarts=task.max_restarts,
            )
        ]
    return [_read_group(raw, i, task, errors, warnings, probed) for i, raw in enumerate(task.groups)]


def fill_env(
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


def warn_part(part: Part, warnings: Warnings) -> None:
    if part.ports:
        warnings.append({"field": [*part.loc, "ports"], "message": (
            f"ports: {', '.join(str(p) for p in part.ports)} are not forwarded by apply: "
            "`muster attach RUN` forwards them to localhost (`-p LOCAL:PORT` picks the local port); "
            "on the cluster, reach them on the node's own address (DSTACK_NODE_IP)")})


def _read_group(
    raw: dict, index: int, task: _TaskInput, errors: ErrorList, warnings: Warnings, probed: ProbedNames | None
) -> Part | None:
    loc: list[str | int] = ["groups", index]
    group, bad = read_model_partially(_GroupInput, raw, loc, errors)
    if group is None:
        return None
    resources = _read_resources(group.resources, [*loc, "resources"], errors, warnings, probed)
    readiness, depends_on = read_readiness(raw, loc, group.ports, errors) if "ports" not in bad else (None, [])
    if bad:
        return None
    return Part(
        loc=loc,
        name=group.name if group.name is not None else str(index),
        nodes=group.nodes,
        resources=resources,
        commands=[*task.setup, *group.commands],
        env=parse_env(group.env, errors, [*loc, "env"]),
        image=group.image,
        ports=group.ports,
        fleets=group.fleets,
        slices=group.slices,
        on_slice_failure=group.on_slice_failure,
        readiness=readiness,
        depends_on=depends_on,
        on_failure=group.on_failure,
        max_restarts=group.max_restarts,
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


def check_group_layout(task: _TaskInput, parts: list[Part | None], errors: ErrorList) -> None:
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


def check_part(
    part: Part,
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
    slices = check_slices(part, shape, errors)
    check_slice_failure(part, errors)
    if shape is not None:
        hosts = shape.hosts * slices
        if nodes is None:
            nodes = hosts
        elif nodes != hosts:
            layout = f"{slices} x {shape.name} slices have {hosts} hosts" if slices > 1 else (
                f"{shape.name} has {shape.hosts} host{'s' if shape.hosts != 1 else ''}")
            errors.add([*part.loc, "nodes"], f"{layout}: set nodes: {hosts} or leave nodes out")
    if nodes is None:
        nodes = 1
    own_env = fill_env(part.env, run_args, secrets, errors, [*part.loc, "env"])
    env = top_env | resolve_env(own_env, env_values, secrets, errors, [*part.loc, "env"])
    fleets = part.fleets or []
    for f, name in enumerate(fleets):
        if task.fleets and name not in task.fleets:
            errors.add([*part.loc, "fleets", f], f"fleet `{name}` is not in the task's `fleets` "
                       f"({', '.join(task.fleets)}): add it there or name one of those")
    # group 0 holds rank 0, the master
    rules, max_restarts = read_policy(part.on_failure, part.max_restarts, part.loc, index == 0, errors)
    if len(errors.items) > before or resources is None or part.readiness is None:
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
        fleets=fleets,
        slices=slices,
        on_slice_failure=part.on_slice_failure or "whole-set",
        probes=part.readiness.probes,
        ready_timeout=part.readiness.ready_timeout,
        depends_on=part.readiness.depends_on,
        on_failure=rules,
        max_restarts=max_restarts,
    )


# Multislice joins slices over the data-center network, which Google offers from v4 on.
MULTISLICE_FAMILIES = ("v4", "v5p", "v5litepod", "v6e")


def check_slices(part: Part, shape: SliceShape | None, errors: ErrorList) -> int:
    """How many slices the group is (1 when `slices` is left out); a 400 naming `slices` when the
    TPU type cannot be joined into a multislice set."""
    if part.slices is None or part.slices == 1:
        return 1
    loc = [*part.loc, "slices"]
    if shape is None:
        errors.add(loc, "slices needs a TPU `gpu:` of v4 or newer in the same resources (e.g. gpu: tpu-v4-16): "
                   "set one or remove slices")
    elif shape.family.name not in MULTISLICE_FAMILIES:
        errors.add(loc, f"multislice needs TPU v4 or newer; {shape.name} slices cannot be joined over the "
                   f"data-center network: use e.g. tpu-v4-{max(shape.size, 16)} or remove slices")
    elif shape.hosts == 1:
        errors.add(loc, f"multislice needs multi-host slices; {shape.name} is one host: use a larger slice "
                   f"({_larger(shape)}) or remove slices")
    else:
        return part.slices
    return 1


def check_slice_failure(part: Part, errors: ErrorList) -> None:
    """`on_slice_failure: replace-slice` keeps the set's other slices, so there must be others."""
    if part.on_slice_failure == "replace-slice" and (part.slices or 1) < 2:
        errors.add([*part.loc, "on_slice_failure"], "replace-slice replaces one slice of a multislice set: "
                   "set slices: 2 or more, or remove on_slice_failure")


def _larger(shape: SliceShape) -> str:
    bigger = [n for n in shape.family.sizes if SliceShape(shape.family, n).hosts > 1]
    return f"{shape.family.name}-{bigger[0]} or larger" if bigger else "a multi-host slice"


def check_references(
    task: _TaskInput,
    written_env: dict[str, str | None],
    parts: list[Part],
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
