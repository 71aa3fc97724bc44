"""Numbers and ranges of the resources grammar: `4`, `2..8`, `16GB..`, `..64GB`, `512MB`."""

from __future__ import annotations

import math
import re
from typing import TypeVar

T = TypeVar("T", int, float)

_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(kb|mb|gb|tb|k|m|g|t)?$", re.IGNORECASE)
_GB_PER_UNIT = {"k": 1 / 1024**2, "m": 1 / 1024, "g": 1.0, "t": 1024.0}
# Bounds on what a resource may ask for, far above any host: a count past 2**63 reached the database
# (a 500 on plan, a run stuck `submitted`), and a count past 2**31 does not fit an integer column.
MAX_COUNT = 1_000_000
MAX_SIZE_GB = 1024.0**2  # 1PB


def split_range(text: str) -> tuple[str | None, str | None] | None:
    """`a..b` -> (a, b); `a..` -> (a, None); `..b` -> (None, b); no `..` -> None."""
    if ".." not in text:
        return None
    low, _, high = text.partition("..")
    low, high = low.strip(), high.strip()
    if not low and not high:
        raise ValueError("a range needs at least one bound (`a..b`, `a..` or `..b`)")
    return (low or None, high or None)


def parse_count(text: str, what: str = "a count") -> int:
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"`{text}` is not a whole number")
    # compared as text first: int() of thousands of digits is itself refused
    return bounded_count(int(text) if len(text) <= len(str(MAX_COUNT)) + 1 else MAX_COUNT + 1, what)


def bounded_count(n: int, what: str) -> int:
    if n > MAX_COUNT:
        raise ValueError(f"{what} is at most {MAX_COUNT}")
    return n


def _range_object(value: dict, what: str, parse) -> tuple:
    """dstack's object form of a range, `{min: 2, max: 8}` (either bound may be left out)."""
    unknown = [str(k) for k in value if k not in ("min", "max")]
    if unknown:
        raise ValueError(f"unknown key `{unknown[0]}`: a range object takes min and max")
    if value.get("min") is None and value.get("max") is None:
        raise ValueError("a range needs at least one of min and max")
    low = None if value.get("min") is None else parse(value["min"])
    high = None if value.get("max") is None else parse(value["max"])
    return check_order(low, high)


def parse_count_range(value: object, what: str) -> tuple[int | None, int | None]:
    """`4` -> (4, 4); `2..8` -> (2, 8); `2..` -> (2, None); `..8` -> (None, 8); {min, max}."""
    if isinstance(value, dict):
        return _range_object(value, what, lambda v: parse_count_range(v, what)[0])
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{what} must be a number or a range like 2..8")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what} cannot be negative")
        return bounded_count(value, what), value
    bounds = split_range(value)
    if bounds is None:
        if value.strip().startswith("-"):
            raise ValueError(f"{what} cannot be negative")
        n = parse_count(value, what)
        return n, n
    low, high = (parse_count(b, what) if b is not None else None for b in bounds)
    return check_order(low, high)


def parse_size(value: object) -> float:
    """GB as a float: `16GB`, `512MB`, `1TB`, `16` or a plain number (GB)."""
    if isinstance(value, bool):
        raise ValueError("expected a size like 16GB")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return _finite(float(value) if isinstance(value, float) or value < 2**60 else math.inf)
    if not isinstance(value, str):
        raise ValueError("expected a size like 16GB")
    m = _SIZE.fullmatch(value.strip())
    if not m:
        raise ValueError(f"cannot read size `{value}`: use e.g. 512MB, 16GB or 1TB")
    unit = (m.group(2) or "g")[0].lower()
    return _finite(float(m.group(1)) * _GB_PER_UNIT[unit])


def _finite(size: float) -> float:
    # NaN and infinity are valid YAML floats but meaningless sizes (and not JSON).
    if math.isnan(size):
        raise ValueError("expected a size like 16GB")
    if size > MAX_SIZE_GB:
        raise ValueError(f"a size is at most 1PB ({MAX_SIZE_GB:.0f}GB)")
    return size


def has_size_unit(text: str) -> bool:
    """True when a token (or both ends of a range) carries a size unit: `24GB`, `40GB..80GB`."""
    parts = [p for p in text.split("..") if p.strip()] if ".." in text else [text]
    return bool(parts) and all(
        (m := _SIZE.fullmatch(p.strip())) is not None and m.group(2) is not None for p in parts
    )


def parse_size_range(value: object) -> tuple[float | None, float | None]:
    """`16GB` -> (16, 16); `16GB..` -> (16, None); `..64GB` -> (None, 64); {min, max}."""
    if isinstance(value, dict):
        return _range_object(value, "size", parse_size)
    if isinstance(value, str):
        bounds = split_range(value)
        if bounds is not None:
            low, high = (parse_size(b) if b is not None else None for b in bounds)
            return check_order(low, high)
    size = parse_size(value)
    return size, size


def check_order(low: T | None, high: T | None) -> tuple[T | None, T | None]:
    if low is not None and high is not None and low > high:
        raise ValueError(f"the range minimum {low:g} is greater than its maximum {high:g}")
    return low, high
