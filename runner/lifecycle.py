"""What every job runner shares, on the host or in a container: its stop flag and how it ends.
"""

from __future__ import annotations

import signal
from typing import Any

DEFAULT_STOP_GRACE = 5.0
WATCH_INTERVAL = 0.1


class StopFlag:
    """Set by SIGTERM/SIGINT/SIGHUP so loops can finish cleanly instead of dying mid-write."""

    def __init__(self) -> None:
        self.set = False

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.set = True


def exit_fields(returncode: int) -> dict[str, Any]:
    """Shell-style exit status: 128+N when the shell was killed by signal N."""
    if returncode < 0:
        return {"exit_status": 128 - returncode, "signal": -returncode}
    return {"exit_status": returncode}


def stop_grace(spec: dict[str, Any]) -> float:
    grace = spec.get("stop_grace")
    return float(grace) if grace is not None else DEFAULT_STOP_GRACE


def final_state(returncode: int, reason: str | None) -> str:
    if reason is not None:
        return reason
    return "done" if returncode == 0 else "failed"
