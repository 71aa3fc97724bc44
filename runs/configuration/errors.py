"""The one error type of the configuration language and the helpers that fill it.

Every problem is reported as `{"loc": [...], "msg": "..."}` with a location that starts at the
configuration root, so the API can return all of them at once and a client can point at the line.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

Loc = list[str | int]


class ConfigurationError(Exception):
    """A configuration that cannot be accepted; `errors` lists every problem found."""

    def __init__(self, errors: list[dict[str, Any]]):
        self.errors = errors
        super().__init__("; ".join(f"{format_loc(e['loc'])}: {e['msg']}" for e in errors))


def format_loc(loc: Sequence[str | int]) -> str:
    """`["groups", 0, "commands", 1]` -> `groups[0].commands[1]` (for messages and logs)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "configuration"


class ErrorList:
    """Collects problems while a whole configuration is checked, so the user sees all of them."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, loc: Sequence[str | int], msg: str) -> None:
        self.items.append({"loc": [_loc_part(p) for p in loc], "msg": msg})

    def extend_from(self, error: ConfigurationError, prefix: Sequence[str | int] = ()) -> None:
        for item in error.errors:
            self.add([*prefix, *item["loc"]], item["msg"])

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigurationError(list(self.items))


def _loc_part(part: object) -> str | int:
    # YAML lets keys be floats, None or dates; a location must stay JSON-safe and typed.
    if isinstance(part, bool) or not isinstance(part, str | int):
        return str(part)
    return part


def from_validation_error(exc: ValidationError, prefix: Sequence[str | int] = (),
                          model: type[BaseModel] | None = None) -> ConfigurationError:
    """Turn pydantic's errors into ours: short human messages, no documentation URLs; an unknown
    key of `model` (or of a model inside it) says which known key it is closest to."""
    errors = ErrorList()
    for item in exc.errors(include_url=False):
        loc = list(item["loc"])
        msg = _message(item, loc)
        if item["type"] == "extra_forbidden" and model is not None and loc:
            msg += _did_you_mean(str(loc[-1]), _keys_at(model, loc[:-1]))
        errors.add([*prefix, *loc], msg)
    return ConfigurationError(errors.items)


def _did_you_mean(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.7)
    return f": did you mean `{close[0]}`?" if close else ""


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The models an annotation can hold: `list[Group] | None` -> Group."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _models_in(arg)


def _keys_at(model: type[BaseModel], path: Sequence[Any]) -> set[str]:
    """The keys a mapping at `path` inside `model` may have (empty where the path leaves the models)."""
    models = [model]
    for part in path:
        if isinstance(part, int):
            continue  # a list index: the annotation's list was unwrapped with its item type
        models = [found for m in models for name, field in m.model_fields.items()
                  if part in (name, field.alias) for found in _models_in(field.annotation)]
    return {field.alias or name for m in models for name, field in m.model_fields.items()}


# pydantic's wording names Python types and model classes; users wrote YAML.
_TYPE_MESSAGES = {
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "list_type": "expected a list",
    "string_type": "expected a string",
    "int_type": "expected a whole number",
    "bool_type": "expected true or false",
    "float_type": "expected a number",
}


def _message(item: dict[str, Any], loc: list[Any]) -> str:
    kind = item["type"]
    key = loc[-1] if loc else "configuration"
    if kind == "extra_forbidden":
        return f"unknown key `{key}`"
    if kind == "missing":
        return f"`{key}` is required"
    if kind == "literal_error" and item.get("input") is None:
        expected = str((item.get("ctx") or {}).get("expected", "")).replace("'", "")
        return f"missing `{key}:`: write `{key}: {expected}`" if expected else f"`{key}` is empty"
    if kind == "invalid_key":
        return "keys must be strings"
    given = item.get("input")
    if kind == "string_type" and isinstance(given, dict) and len(given) == 1:
        # `- echo a: b` is YAML for the mapping {"echo a": "b"}: the command had an unquoted `: `
        (k, v), = given.items()
        return (f"expected a string, got the mapping `{k}: {v}`: a `: ` in a command makes YAML read a "
                f"mapping: quote the command, e.g. - \"{k}: {v}\"")
    if kind in _TYPE_MESSAGES:
        return _TYPE_MESSAGES[kind]
    msg = str(item["msg"])
    # Our own validators raise ValueError; pydantic prefixes it with its error class.
    for noise in ("Value error, ", "Assertion failed, "):
        if msg.startswith(noise):
            msg = msg[len(noise) :]
    return msg
