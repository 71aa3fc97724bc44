"""Durations as users write them (`90s`, `30m`, `4h`, `1d`, `1h30m`, or seconds) -> int seconds."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"([0-9]+)\s*([smhdw])")
_WHOLE = re.compile(r"^(?:[0-9]+\s*[smhdw]\s*)+$")


def parse_duration(value: object) -> int:
    """Seconds for an int or a duration string; ValueError with a user-facing message otherwise."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 90s, 30m, 4h, 1d or a number of seconds")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return value
    if not isinstance(value, str):
        raise ValueError("expected a duration like 90s, 30m, 4h, 1d or a number of seconds")
    text = value.strip().lower()
    if text.startswith("-"):
        raise ValueError("a duration cannot be negative")
    if text.isascii() and text.isdigit():
        return int(text)
    if not _WHOLE.fullmatch(text):
        raise ValueError(f"cannot read duration `{value}`: use e.g. 90s, 30m, 4h, 1d or 1h30m")
    return sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(text))


def parse_optional_duration(value: object) -> int | None:
    """Like parse_duration, but `off` means no limit (None)."""
    if isinstance(value, str) and value.strip().lower() == "off":
        return None
    return parse_duration(value)
