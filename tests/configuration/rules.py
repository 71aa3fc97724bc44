"""The row makers and the check of the configuration rules tables (test_rules_table.py: tasks,
test_rules_table_fleets.py: fleets): what a user writes and what they get, one row each.

Valid rows assert key fields of the parsed result (paths into `model_dump(mode="json")`); invalid
rows assert the exact error location and a phrase of its message.
"""

from __future__ import annotations

from textwrap import dedent
from typing import Any

import pytest

from runs.configuration import ConfigurationError, parse_any_configuration

REF = "${{ groups[1].nodes[0].IP_ADDRESS }}"


def ok(case_id: str, doc: str | dict, expect: dict[str, Any], **kwargs: Any) -> Any:
    return pytest.param(doc, kwargs, expect, None, None, id=case_id)


def bad(case_id: str, doc: str | dict, loc: list[str | int], phrase: str, **kwargs: Any) -> Any:
    return pytest.param(doc, kwargs, None, loc, phrase, id=case_id)


def task(**fields: Any) -> dict:
    return {"type": "task", **fields}


def two_groups(first: dict | None = None, second: dict | None = None, **top: Any) -> dict:
    return task(
        groups=[
            {"name": "router", "nodes": 1, "commands": ["serve"], **(first or {})},
            {"name": "worker", "nodes": 2, "commands": ["work"], **(second or {})},
        ],
        **top,
    )


def yaml(text: str) -> str:
    return dedent(text).lstrip()


def _at(value: Any, path: str) -> Any:
    for part in path.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def check_rule(doc: Any, kwargs: dict, expect: dict | None, loc: list | None, phrase: str | None) -> None:
    # Fleets take no task keyword arguments; the table only passes them to tasks.
    if expect is not None:
        result = parse_any_configuration(doc, **kwargs).model_dump(mode="json")
        for path, wanted in expect.items():
            assert _at(result, path) == wanted, path
        return
    with pytest.raises(ConfigurationError) as raised:
        parse_any_configuration(doc, **kwargs)
    errors = raised.value.errors
    matching = [e for e in errors if e["loc"] == loc]
    assert matching, f"no error at {loc}; got {errors}"
    assert any(phrase in e["msg"] for e in matching), f"{phrase!r} not in {matching}"
