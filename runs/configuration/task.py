"""`type: task`: from the written configuration to a checked, normalized TaskConfiguration.

This module is the parser's order of work: read the document (`task_written`), read and check
each group (`task_groups`), apply the task-wide rules, and build the result (`task_checked`).
"""

from __future__ import annotations

from collections.abc import Mapping

from . import dialect
from .documents import load_document
from .envs import parse_env, resolve_env
from .errors import ErrorList, format_loc
from .fields import read_model_partially
from .gpu_spec import ProbedNames
from .readiness import check_dependencies
from .resources import SHM_WITHOUT_IMAGE, Warnings
from .task_checked import RetryPolicy, TaskConfiguration
from .task_groups import check_group_layout, check_part, check_references, fill_env, read_parts, warn_part
from .task_written import _TaskInput

DEFAULT_MAX_NODES = 4096


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
    parts = read_parts(task, document, bad, errors, warnings, probed_gpu_names)
    if dialect.has_image(task):  # shm_size takes effect: the jobs run in containers
        warnings[:] = [w for w in warnings if SHM_WITHOUT_IMAGE not in w["message"]]

    if parts is not None and task.groups is not None:
        check_group_layout(task, parts, errors)
    readable = [p for p in parts or [] if p is not None]
    for part in readable:
        warn_part(part, warnings)
    env_values = env_values or {}
    # not `secrets or {}`: truth-testing a lazy mapping would read the secrets of every submit
    secrets = {} if secrets is None else secrets
    written_env = fill_env(written_env, run_args, secrets, errors, ["env"])
    top_env = resolve_env(written_env, env_values, secrets, errors, ["env"])
    groups = [
        check_part(part, i, task, top_env, env_values, secrets, run_args, errors)
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
        check_references(task, written_env, readable, groups, errors)
        if task.groups is not None:
            check_dependencies([p.name for p in readable], [p.loc for p in readable],
                               [p.depends_on for p in readable], task.startup_order, errors)
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


