"""Tiny typed readers for environment settings (healthchecks style: stdlib only)."""

from __future__ import annotations

import os
from pathlib import Path


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def data_dir() -> Path:
    """MUSTER_DATA_DIR, or `.muster-data/` in the checkout whatever the working directory: the server,
    `muster serve` and its children must agree on it, or beat's schedule and the local agents' stop
    files land beside a database that is elsewhere."""
    return Path(env_str("MUSTER_DATA_DIR", str(Path(__file__).resolve().parent.parent / ".muster-data"))).resolve()
