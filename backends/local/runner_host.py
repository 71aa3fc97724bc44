"""The runner agent on a local instance: the same runner package as on a remote host.

The agent itself is a process of its own (started through the zipapp's `ensure-agent`, detached),
but the verbs the server calls of a job (status, submit, stop, log, cleanup) only read and write
files under the home and signal the job's processes, so they run in this process, the runner
package imported directly: a Python process started per call cost about 70 ms of CPU (more on a
loaded machine), four to six times per local job, and was most of a worker's time with local runs
(docs/performance.md, the soak). Only `ensure-agent`, which starts the agent, still runs the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from backends.base import BackendError, RunnerHost
from backends.runner_archive import runner_archive
from runner import commands, log_times
from runner.files import Paths


class LocalRunnerHost(RunnerHost):
    def __init__(self, home: str | Path, timeout: float = 30.0):
        self.home = str(home)
        self.timeout = timeout

    def _call(self, *args: str, stdin: bytes | None = None) -> bytes:
        try:
            done = subprocess.run(
                [sys.executable, str(runner_archive()), args[0], "--home", self.home, *args[1:]],
                input=stdin, capture_output=True, timeout=self.timeout, check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BackendError(f"runner {args[0]} timed out after {self.timeout}s") from exc
        if done.returncode != 0:
            # the runner says why on stderr, or as {"error": ...} on stdout (ensure-agent in a retired home)
            said = (done.stderr or done.stdout).decode(errors="replace")[-500:]
            raise BackendError(f"runner {args[0]} failed: {said}")
        return done.stdout

    def ensure_agent(self, revive: bool = False) -> None:
        try:
            Path(self.home).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BackendError(f"cannot create the runner home {self.home}: {exc}") from exc
        self._call("ensure-agent", *(["--revive"] if revive else []))

    def _verb(self, name: str, verb, *args: Any) -> Any:
        # a bad job id (ValueError) and OS errors, as the CLI's exit code would have said them
        try:
            return verb(Paths(self.home), *args)
        except (OSError, ValueError) as exc:
            raise BackendError(f"runner {name} failed: {exc}") from exc

    def submit(self, job_id: str, spec: dict[str, Any]) -> None:
        answer = self._verb("submit", commands.submit_job, job_id, json.dumps(spec).encode())
        if answer.get("error"):  # a refusal: the CLI exits 1 on it (runner/commands.py: cmd_submit)
            raise BackendError(f"runner submit failed: {answer['error']}")

    def status(self) -> dict[str, Any]:
        return self._verb("status", commands.status_report)

    def stop(self, job_id: str) -> None:
        self._verb("stop", commands.stop_job, job_id)

    def read_log(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        if offset < 0 or limit < 0:
            raise BackendError("runner log failed: offset and limit must be >= 0")
        return self._verb("log", lambda paths, *a: b"".join(commands.log_chunks(paths, *a)), job_id, offset, limit)

    def read_log_timed(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> tuple[bytes, list[tuple[int, int]]]:
        if offset < 0 or limit < 0:
            raise BackendError("runner log failed: offset and limit must be >= 0")
        return log_times.unframe(self._verb("log", commands.log_timed, job_id, offset, limit), limit)

    def cleanup(self, job_id: str) -> None:
        self._verb("cleanup", commands.cleanup_job, job_id)

    def stop_agent(self) -> None:
        """Ask the agent to exit (it watches for this file); used when a local fleet is deleted."""
        if Path(self.home).exists():
            (Path(self.home) / "retired").touch()  # no look brings it back (runner/files.py: Paths.retired)
            (Path(self.home) / "agent.stop").touch()
