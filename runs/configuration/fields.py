"""Checks shared by task and fleet configurations: names, ports, and the input and checked base models."""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from .errors import ErrorList, from_validation_error

SLUG = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
M = TypeVar("M", bound="WrittenModel")
SLUG_RULE = "lowercase letters, digits and dashes, starting with a letter, at most 40 characters"
# dstack's rule for group names, which it defaults to "0", "1", ... (so a digit may come first).
GROUP_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
GROUP_NAME_RULE = "lowercase letters, digits and dashes, starting with a letter or digit, at most 40 characters"


class WrittenModel(BaseModel):
    """The configuration as written: no coercion (`"4"` is not 4, `1` is not `true`), no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True)


class CheckedModel(BaseModel):
    """The configuration as checked and normalized: frozen, no unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def read_model(model: type[M], raw: object, loc: list[str | int], errors: ErrorList) -> M | None:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors.extend_from(from_validation_error(exc, model=model), loc)
        return None


def read_model_partially(
    model: type[M], raw: object, loc: list[str | int], errors: ErrorList
) -> tuple[M | None, set[str]]:
    """Like read_model, but a key with a problem is reported, then left out and the rest read
    again, so the later checks still run and the user sees every problem of the document at once.

    Returns the model read from the good keys (None if even that fails) and the keys left out.
    """
    try:
        return model.model_validate(raw), set()
    except ValidationError as exc:
        errors.extend_from(from_validation_error(exc, model=model), loc)
        first = exc
    if not isinstance(raw, dict):
        return None, set()
    bad = {str(item["loc"][0]) for item in first.errors() if item["loc"]}
    remaining = {k: v for k, v in raw.items() if str(k) not in bad}
    if len(remaining) == len(raw):  # a problem no key can be blamed for (e.g. a missing key)
        return None, bad
    try:
        return model.model_validate(remaining), bad
    except ValidationError:
        # a cross-key check failed only once a key was gone: nothing more to learn from it
        return None, bad


def check_group_name(value: str | None) -> str | None:
    if value is not None and not GROUP_NAME.fullmatch(value):
        raise ValueError(f"`{value}` is not a valid group name: use {GROUP_NAME_RULE}")
    return value


def check_slug(value: str | None) -> str | None:
    if value is not None and not SLUG.fullmatch(value):
        raise ValueError(f"`{value}` is not a valid name: use {SLUG_RULE}")
    return value


def check_port(item: object) -> int | str:
    """`8000` or `"8000:8080"` (local:container); digits as a string are read as a number."""
    if isinstance(item, bool) or not isinstance(item, int | str):
        raise ValueError("a port must be a number or a `local:container` string like 8000:8080")
    if isinstance(item, str) and ":" in item:
        left, _, right = item.partition(":")
        _port_number(left.strip(), item)
        _port_number(right.strip(), item)
        return f"{left.strip()}:{right.strip()}"
    return _port_number(item, item)


# A port as written; checked one by one so an error points at the list item.
Port = Annotated[Any, AfterValidator(check_port)]


def _port_number(value: int | str, written: object) -> int:
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit()):
            raise ValueError(f"`{written}` is not a port: use a number or local:container like 8000:8080")
        value = int(value)
    if not 1 <= value <= 65535:
        raise ValueError(f"port {value} is out of range (1..65535)")
    return value
