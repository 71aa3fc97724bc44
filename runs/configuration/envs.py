"""`env` as users write it: a list of `KEY=VALUE` / bare `KEY`, or a mapping.

A bare key (or a mapping value left empty) takes its value at submit time from the values passed
with the run, then from the project's secrets; a key with neither is an error, because a job that
silently starts without HF_TOKEN fails much later and less clearly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .errors import ErrorList

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env(raw: object, errors: ErrorList, loc: Sequence[str | int]) -> dict[str, str | None]:
    """Written env -> {key: value, or None for a key whose value comes from outside}."""
    env: dict[str, str | None] = {}
    if raw is None:
        return env
    if isinstance(raw, list):
        for i, item in enumerate(raw):
            if not isinstance(item, str):
                errors.add([*loc, i], "an env entry must be a string: KEY=VALUE or KEY")
                continue
            key, sep, value = item.partition("=")
            key = key.strip()
            if not _KEY.fullmatch(key):
                errors.add([*loc, i], f"`{key}` is not a valid variable name")
            elif key in env:
                errors.add([*loc, i], f"`{key}` is set twice")
            else:
                env[key] = value if sep else None
        return env
    if isinstance(raw, dict):
        for key, value in raw.items():
            if not isinstance(key, str) or not _KEY.fullmatch(key):
                errors.add([*loc, str(key)], f"`{key}` is not a valid variable name")
            elif isinstance(value, bool):
                env[key] = "true" if value else "false"
            elif value is None or isinstance(value, str):
                env[key] = value
            elif isinstance(value, int | float):
                env[key] = str(value)
            else:
                errors.add([*loc, key], f"the value of `{key}` must be a string or a number")
        return env
    errors.add(list(loc), "env must be a list of KEY=VALUE (or bare KEY) entries, or a mapping")
    return env


def resolve_env(
    env: Mapping[str, str | None],
    env_values: Mapping[str, str],
    secrets: Mapping[str, str],
    errors: ErrorList,
    loc: Sequence[str | int],
) -> dict[str, str]:
    """Fill the keys written without a value; report each one that nobody provides."""
    resolved: dict[str, str] = {}
    for key, value in env.items():
        if value is not None:
            resolved[key] = value
        elif key in env_values:
            resolved[key] = env_values[key]
        elif key in secrets:
            resolved[key] = secrets[key]
        else:
            errors.add(
                [*loc, key],
                f"`{key}` has no value: pass it with the run (env values) or create a secret named {key}",
            )
    return resolved
