"""Durations as users write them (`90s`, `30m`, `4h`, `1d`, `1h30m`, or seconds) -> int seconds."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# Ten years: far beyond any run, well inside what datetime arithmetic (and the database) can hold;
# an unbounded value overflowed the deadline computed from it and wedged the run.
MAX_DURATION_SECONDS = 3650 * 86400
_TOO_LONG = "duration `{}` is too long: at most 3650d (ten years), or `off` where no limit is allowed"
_PART = re.compile(r"([0-9]+)\s*([smhdw])")
_WHOLE = re.compile(r"^(?:[0-9]+\s*[smhdw]\s*)+$")


def parse_duration(value: object) -> int:
    """Seconds for an int or a duration string; ValueError with a user-facing message otherwise."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 90s, 30m, 4h, 1d or a number of seconds")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return _bounded(value, value)
    if not isinstance(value, str):
        raise ValueError("expected a duration like 90s, 30m, 4h, 1d or a number of seconds")
    text = value.strip().lower()
    if text.startswith("-"):
        raise ValueError("a duration cannot be negative")
    if len(text) > 64:  # no real duration is this long; int() of a huge digit string is slow
        raise ValueError(_TOO_LONG.format(value[:20] + "..."))
    if text.isascii() and text.isdigit():
        return _bounded(int(text), value)
    if not _WHOLE.fullmatch(text):
        raise ValueError(f"cannot read duration `{value}`: use e.g. 90s, 30m, 4h, 1d or 1h30m")
    return _bounded(sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(text)), value)


def _bounded(seconds: int, written: object) -> int:
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(_TOO_LONG.format(written))
    return seconds


def parse_optional_duration(value: object) -> int | None:
    """Like parse_duration, but `off` (or dstack's `false`) means no limit (None)."""
    if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    return parse_duration(value)
