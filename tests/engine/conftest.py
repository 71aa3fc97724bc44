"""Engine tests start real runner agents and job processes; none may outlive its test."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest


def _kill_everything_under(local_dir: Path) -> None:
    for home in local_dir.glob("*/muster"):
        (home / "agent.stop").touch()
        for status in home.glob("jobs/*/status.json"):
            try:
                pgid = json.loads(status.read_text()).get("pgid")
                if pgid:
                    os.killpg(int(pgid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        try:
            os.kill(int((home / "agent.pid").read_text().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.fixture(autouse=True)
def _no_leftover_processes(settings):
    yield
    _kill_everything_under(Path(settings.MUSTER["LOCAL_DIR"]))
