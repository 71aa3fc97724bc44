"""Runner agents and job processes a test started on local hosts, found through their homes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path


def kill_everything_under(local_dir: Path) -> None:
    """Stop the runner agents and job process groups of every local host home under `local_dir`."""
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


def as_from_a_terminal() -> None:
    """Popen's preexec_fn for a process a test sends Ctrl-C (SIGINT): a shell started in the
    background without job control (`cmd &`, nohup, some CI runners) hands its children SIGINT
    ignored, and Python then keeps ignoring it; a user's terminal does not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
