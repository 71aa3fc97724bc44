"""Waiting for something to become true, shared by the tests that drive real processes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

# One setting for how long the tests wait on real processes: every wait is its nominal time times
# MUSTER_TEST_PATIENCE. The nominal times are what an idle 2-CPU machine needs with room; a loaded
# machine (two suites at once, a bench alongside) needs several times more, and a wait that ends
# early costs nothing, so the default is generous. Only a failing test waits the whole time.
PATIENCE = float(os.environ.get("MUSTER_TEST_PATIENCE") or 3)


def patient(seconds: float) -> float:
    """`seconds` of waiting on an idle machine, scaled by MUSTER_TEST_PATIENCE."""
    return seconds * PATIENCE


def wait_until(check: Callable[[], Any], timeout: float = 30, what: str = "", interval: float = 0.2) -> Any:
    """Poll `check` until it returns something truthy; fail the test after `timeout` seconds
    (nominal: scaled by MUSTER_TEST_PATIENCE)."""
    timeout = patient(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")


def job_states(run) -> list[tuple]:
    return [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in run.current_jobs()]
