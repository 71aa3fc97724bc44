"""Waiting for something to become true, shared by the tests that drive real processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(check: Callable[[], Any], timeout: float = 30, what: str = "", interval: float = 0.2) -> Any:
    """Poll `check` until it returns something truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")


def job_states(run) -> list[tuple]:
    return [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in run.current_jobs()]
