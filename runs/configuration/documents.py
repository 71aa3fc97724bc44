"""Reading a configuration document: YAML or JSON text, or an already-parsed mapping."""

from __future__ import annotations

import yaml

from cli.strict_yaml import StrictLoader
from muster.text import unstorable_at

from .errors import ConfigurationError


class _StrictLoader(StrictLoader):
    """The CLI's loader (no key written twice, cli/strict_yaml.py), with integers bounded."""


def _construct_int(loader: _StrictLoader, node: yaml.ScalarNode) -> int:
    # Python refuses int() of more than 4300 digits (a CPU guard) with a bare ValueError
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(node.value)} characters is too large", node.start_mark) from None


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load_document(data: str | dict) -> dict:
    """YAML or JSON text (or a dict) -> dict; anything but a mapping at the top is an error."""
    if isinstance(data, dict):
        return _without_nul(data)
    if not isinstance(data, str):
        raise _error(f"expected YAML or JSON text, got {type(data).__name__}")
    try:
        parsed = yaml.load(data, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        raise _error(_describe_yaml_error(exc)) from None
    except yaml.YAMLError as exc:
        raise _error(f"invalid YAML: {exc}") from None
    except RecursionError:
        raise _error("the document is nested too deeply") from None
    if parsed is None:
        raise _error("the configuration is empty")
    if not isinstance(parsed, dict):
        raise _error(f"the configuration must be a mapping of keys to values, not a {_kind(parsed)}")
    return _without_nul(parsed)


def _without_nul(doc: dict) -> dict:
    # YAML's "\0" escape makes a NUL, which PostgreSQL cannot store (muster/text.py)
    found = unstorable_at(doc)
    if found is not None:
        raise ConfigurationError([{"loc": found[0], "msg": found[1]}])
    return doc


def _describe_yaml_error(exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or "invalid YAML"
    if mark is None:
        return f"invalid YAML: {problem}"
    # PyYAML counts from 0; editors count from 1.
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _error(msg: str) -> ConfigurationError:
    return ConfigurationError([{"loc": ["configuration"], "msg": msg}])
