"""Reading documents, and reporting every problem of a configuration at once."""

from __future__ import annotations

import pytest

from runs.configuration import ConfigurationError, load_document, parse_run_configuration


def test_yaml_and_json_text_and_dicts_are_read() -> None:
    assert load_document("type: task\nnodes: 2\n") == {"type": "task", "nodes": 2}
    assert load_document('{"type": "task"}') == {"type": "task"}
    assert load_document({"type": "fleet"}) == {"type": "fleet"}


@pytest.mark.parametrize(
    ("data", "phrase"),
    [
        ("", "empty"),
        ("# only a comment\n", "empty"),
        ("- a\n- b\n", "not a list"),
        ("just text", "not a string"),
        ("42", "not a number"),
        (b"type: task", "expected YAML or JSON text"),
        ("a: [1, 2\n", "line 2, column 1"),
        ("a: b\n  c: d\n", "line 2, column 4"),
        ("a: 1\na: 2\n", "duplicate key `a`"),
    ],
)
def test_documents_that_are_not_configurations(data: object, phrase: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        load_document(data)  # type: ignore[arg-type]
    [error] = raised.value.errors
    assert error["loc"] == ["configuration"]
    assert phrase in error["msg"]


def test_all_problems_are_reported_together() -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_run_configuration(
            {
                "type": "task",
                "comands": ["x"],
                "groups": [
                    {"name": "ok", "nodes": 1},
                    {"name": "Bad", "nodes": 0},
                    {"name": "gpu", "resources": {"gpu": "v2-12"}},
                ],
            }
        )
    locs = [e["loc"] for e in raised.value.errors]
    assert ["comands"] in locs
    assert ["groups", 1, "name"] in locs
    assert ["groups", 1, "nodes"] in locs
    assert ["groups", 2, "resources", "gpu"] in locs


def test_semantic_problems_of_several_groups_are_reported_together() -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_run_configuration(
            {
                "type": "task",
                "env": ["MISSING"],
                "groups": [
                    {
                        "name": "a",
                        "resources": {"gpu": "MI300X"},
                        "commands": ["${{ groups[1].nodes[9].IP_ADDRESS }}"],
                    },
                    {"name": "b", "nodes": 2, "resources": {"gpu": "v2-32"}},
                ],
            }
        )
    locs = [e["loc"] for e in raised.value.errors]
    assert locs.count(["env", "MISSING"]) == 1
    assert ["groups", 0, "resources", "gpu"] in locs
    assert ["groups", 1, "nodes"] in locs


def test_the_error_string_names_each_location() -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_run_configuration({"type": "task", "groups": [{"name": "a", "nodez": 1}]})
    assert "groups[0].nodez: unknown key `nodez`" in str(raised.value)
