"""The runner agent on a local instance: the same CLI as on a remote host, run as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from backends.base import BackendError, RunnerHost

RUNNER = Path(__file__).resolve().parents[2] / "runner" / "muster_runner.py"


class LocalRunnerHost(RunnerHost):
    def __init__(self, home: str | Path, timeout: float = 30.0):
        self.home = str(home)
        self.timeout = timeout

    def _call(self, *args: str, stdin: bytes | None = None) -> bytes:
        try:
            done = subprocess.run(
                [sys.executable, str(RUNNER), args[0], "--home", self.home, *args[1:]],
                input=stdin, capture_output=True, timeout=self.timeout, check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BackendError(f"runner {args[0]} timed out after {self.timeout}s") from exc
        if done.returncode != 0:
            raise BackendError(f"runner {args[0]} failed: {done.stderr.decode(errors='replace')[-500:]}")
        return done.stdout

    def ensure_agent(self) -> None:
        try:
            Path(self.home).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BackendError(f"cannot create the runner home {self.home}: {exc}") from exc
        self._call("ensure-agent")

    def submit(self, job_id: str, spec: dict[str, Any]) -> None:
        self._call("submit", "--job", job_id, stdin=json.dumps(spec).encode())

    def status(self) -> dict[str, Any]:
        return json.loads(self._call("status"))

    def stop(self, job_id: str) -> None:
        self._call("stop", "--job", job_id)

    def read_log(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        return self._call("log", "--job", job_id, "--offset", str(offset), "--limit", str(limit))

    def cleanup(self, job_id: str) -> None:
        self._call("cleanup", "--job", job_id)

    def stop_agent(self) -> None:
        """Ask the agent to exit (it watches for this file); used when a local fleet is deleted."""
        path = Path(self.home) / "agent.stop"
        if Path(self.home).exists():
            path.touch()
