"""The runner agent on an SSH host, driven through short `muster_runner.pyz` CLI calls.

Each method is one SSH exec (ensure_agent is two when the runner's zipapp has to be uploaded) over one
paramiko connection kept per object. The runner home is resolved on the host: the target's
`runner_home`, else `${MUSTER_HOME:-$HOME/.muster}`.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import threading
import uuid
from pathlib import Path
from typing import Any

import paramiko

from backends.base import BackendError, RunnerHost
from backends.runner_archive import runner_archive_bytes
from backends.ssh import commands, connection
from backends.ssh.connection import SSHTarget
from backends.ssh.errors import HostUnreachable
from backends.ssh.output_limit import output_limit
from backends.ssh.probe import probe, probe_docker
from runner import log_times

# Where the zipapp (runner/shipping.py) lives under the runner home on the host.
REMOTE_RUNNER = "bin/muster_runner.pyz"

# Exit codes of the ensure-agent preamble (outside the runner's own 0/1/2).
_NEEDS_UPLOAD = 91
_NO_PYTHON = 92
_NO_HOME = 93


class RunnerError(BackendError):
    """The runner on the host answered, but with an error."""


class SSHRunnerHost(RunnerHost):
    def __init__(self, target: SSHTarget, runner_path: str | Path | None = None, timeout: float = 30):
        self.target = target
        # None: the zipapp built from this checkout's runner package
        self.runner_path = Path(runner_path) if runner_path is not None else None
        self.timeout = timeout
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"<SSHRunnerHost {self.target.where}>"

    # --- connection -------------------------------------------------------------------------------

    def _connection(self) -> paramiko.SSHClient:
        transport = self._client.get_transport() if self._client else None
        if self._client is None or transport is None or not transport.is_active():
            self._drop()
            self._client = connection.connect(self.target, timeout=min(self.timeout, 10))
        return self._client

    def _drop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _with_client(self, action):
        """Run action(client); if a kept connection turned out dead, reconnect once and retry.

        Every runner command is idempotent, so running one twice after a dropped connection is safe.
        """
        with self._lock:
            reused = self._client is not None
            try:
                return action(self._connection())
            except HostUnreachable:
                self._drop()
                if not reused:
                    raise
            return action(self._connection())

    def _exec(
        self, command: str, stdin: bytes | None = None, timeout: float | None = None,
        max_output: int | None = None,
    ) -> tuple[int, bytes, bytes]:
        return self._with_client(
            lambda c: commands.run(c, command, timeout=timeout or self.timeout, stdin=stdin, max_output=max_output)
        )

    # --- shell snippets ---------------------------------------------------------------------------

    def _home_expr(self) -> str:
        home = self.target.runner_home
        if not home:
            return '"${MUSTER_HOME:-$HOME/.muster}"'
        if home == "~":
            return '"$HOME"'
        if home.startswith("~/"):
            return '"$HOME"' + shlex.quote(home[1:])
        if not home.startswith("/"):
            # Relative: a home of its own under the host's default one (see engine.ssh_registration).
            return '"${MUSTER_HOME:-$HOME/.muster}"/' + shlex.quote(home)
        return shlex.quote(home)

    def _runner_command(self, args: str, prefix: str = "") -> str:
        return f'H={self._home_expr()}; {prefix}exec python3 "$H/{REMOTE_RUNNER}" {args} --home "$H"'

    def forward_command(self, ip: str, ports: list[int], keys_expr: str, grant: str) -> str:
        """The shell command that carries one attach connection to ip:$SSH_ORIGINAL_COMMAND
        (runs/services/attach.py puts it in an attach key's command="..."), while the line marked
        `grant` is still in the file `keys_expr` (a shell word) names."""
        return self._runner_command(f"forward --to {shlex.quote(ip)} --ports {','.join(map(str, ports))} "
                                    f"--keys {keys_expr} --grant {shlex.quote(grant)}")

    def shell_command(self, job_id: str, keys_expr: str = "", grant: str = "") -> str:
        """The shell command that runs $SSH_ORIGINAL_COMMAND (or a login shell) in job `job_id`'s
        environment (runner/shell.py), while the line marked `grant` is in the file `keys_expr` names
        (no grant: the caller is the server itself, which checks access on its side)."""
        held = f" --keys {keys_expr} --grant {shlex.quote(grant)}" if grant else ""
        return self._runner_command(f"shell --job {shlex.quote(job_id)}{held}")

    def open_shell(self, job_id: str, command: str | None, pty: tuple[str, int, int] | None):
        """A session on this host running the job's `shell` (the dstack gateway's `ssh <run>`):
        `command`, or a login shell when None; a terminal of `pty` (term, columns, rows) if given.

        The command (which often holds tokens) goes to a private file under the runner home first,
        on stdin, and the shell verb reads and removes it: in the exec line it would sit in the
        arguments of the host's `sh -c`, which anyone on the host can list."""
        held = ""
        if command is not None:
            name = uuid.uuid4().hex
            folder = '"$H/shell-commands"'
            status, out, err = self._exec(
                f'H={self._home_expr()}; umask 077; mkdir -p {folder} && cat > {folder}/{name}',
                stdin=command.encode())
            if status != 0:
                raise RunnerError(self._failure("shell", status, out, err))
            held = f" --command-file {name}"
        with self._lock:
            channel = self._connection().get_transport().open_session(timeout=self.timeout)
        if pty is not None:
            channel.get_pty(term=pty[0], width=pty[1], height=pty[2])
        channel.exec_command(self._runner_command(f"shell --job {shlex.quote(job_id)}{held}"))
        return channel

    def _runner(self, args: str, stdin: bytes | None = None, prefix: str = "", max_output: int | None = None) -> bytes:
        status, out, err = self._exec(self._runner_command(args, prefix), stdin=stdin, max_output=max_output)
        if status != 0:
            raise RunnerError(self._failure(args.split()[0], status, out, err))
        return out

    def _runner_json(self, args: str, stdin: bytes | None = None) -> dict[str, Any]:
        return self._parse_json(args.split()[0], self._runner(args, stdin=stdin))

    def _parse_json(self, what: str, out: bytes) -> dict[str, Any]:
        try:
            data = json.loads(out)
        except ValueError as exc:
            raise RunnerError(
                f"runner {what} on {self.target.where} printed non-JSON: {out[:200]!r}"
            ) from exc
        if not isinstance(data, dict):
            raise RunnerError(f"runner {what} on {self.target.where} printed {data!r}")
        return data

    def _failure(self, what: str, status: int, out: bytes, err: bytes) -> str:
        detail = (err or out).decode(errors="replace").strip()[-500:]
        return f"runner {what} on {self.target.where} exited with status {status}: {detail}"

    # --- RunnerHost -------------------------------------------------------------------------------

    def ensure_agent(self, revive: bool = False) -> None:
        """Start the runner agent unless it runs. `revive`: also in a home whose instance was deleted
        (only a registration asks for that; a look at a job must not bring a stopped agent back)."""
        command = "ensure-agent --revive" if revive else "ensure-agent"
        data = self.runner_path.read_bytes() if self.runner_path else runner_archive_bytes()
        digest = hashlib.sha256(data).hexdigest()
        # One round trip when the runner is current: compare hashes, then start the agent.
        script = (
            f'H={self._home_expr()}; R="$H/{REMOTE_RUNNER}"; '
            f"command -v python3 >/dev/null 2>&1 || exit {_NO_PYTHON}; "
            f'mkdir -p "$H/bin" || exit {_NO_HOME}; '
            f'if [ "$(sha256sum "$R" 2>/dev/null | cut -d\' \' -f1)" = {digest} ]; then '
            f'exec python3 "$R" {command} --home "$H"; fi; '
            f'printf "%s" "$H"; exit {_NEEDS_UPLOAD}'
        )
        status, out, err = self._exec(script)
        if status == _NEEDS_UPLOAD:
            home = out.decode()
            remote = f"{home}/{REMOTE_RUNNER}"
            self._with_client(
                lambda c: commands.put_file(c, data, remote, mode=0o755, timeout=self.timeout)
            )
            status, out, err = self._exec(self._runner_command(command))
        if status == _NO_PYTHON:
            raise RunnerError(
                f"python3 is not installed on {self.target.where}; the Muster runner needs Python 3.8+"
            )
        if status == _NO_HOME:
            raise RunnerError(
                f"cannot create the runner home on {self.target.where}: {err.decode(errors='replace')}"
            )
        if status != 0:
            raise RunnerError(self._failure("ensure-agent", status, out, err))

    def submit(self, job_id: str, spec: dict[str, Any]) -> None:
        self._runner_json(f"submit --job {shlex.quote(job_id)}", stdin=json.dumps(spec).encode())

    def status(self) -> dict[str, Any]:
        # A host without the runner's zipapp (never set up, or reinstalled) has no agent and no jobs;
        # saying so lets the caller run ensure_agent instead of treating it as an error.
        missing = '{"now": %s, "agent": null, "agent_alive": false, "jobs": {}, "installed": false}'
        out = self._runner(
            "status",
            prefix=f'[ -f "$H/{REMOTE_RUNNER}" ] || {{ printf {shlex.quote(missing)} "$(date +%s)"; exit 0; }}; ',
        )
        return self._parse_json("status", out)

    def stop(self, job_id: str) -> None:
        self._runner_json(f"stop --job {shlex.quote(job_id)}")

    def read_log(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        # A log chunk may be larger than the output limit for probes and status; never more than asked.
        cap = max(output_limit(), int(limit) + (64 << 10))
        return self._runner(
            f"log --job {shlex.quote(job_id)} --offset {int(offset)} --limit {int(limit)}", max_output=cap
        )

    def read_log_timed(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> tuple[bytes, list[tuple[int, int]]]:
        # the records of a chunk are MAX_RECORDS at most (runner/log_times.py: framed)
        cap = max(output_limit(), int(limit) + (64 << 10) + log_times.MAX_RECORDS * log_times.RECORD.size)
        try:
            body = self._runner(f"log --job {shlex.quote(job_id)} --offset {int(offset)} --limit {int(limit)} --times",
                                max_output=cap)
        except BackendError as exc:
            if "unrecognized arguments" not in str(exc):
                raise
            return self.read_log(job_id, offset, limit), []  # a runner from before output.times
        return log_times.unframe(body, int(limit))

    def cleanup(self, job_id: str) -> None:
        self._runner_json(f"cleanup --job {shlex.quote(job_id)}")

    def stop_agent(self, wait: float = 10.0) -> None:
        """Stop every job and then the agent (its fleet is being deleted); one round trip.

        The agent exits when HOME/agent.stop exists; jobs are separate sessions that outlive it, so
        each gets its own stop file first. HOME/retired keeps any later ensure-agent but a
        registration's from starting it again. Waits up to `wait` seconds for the agent's process to be
        gone (not just its pid file, which the agent removes a moment before it exits).
        """
        ticks = max(1, int(wait * 10))
        script = (
            f'H={self._home_expr()}; [ -d "$H" ] || exit 0; '
            'p=$(cat "$H/agent.pid" 2>/dev/null); '
            ': > "$H/retired"; for d in "$H"/jobs/*/; do [ -d "$d" ] && : > "$d/stop"; done; '
            ': > "$H/agent.stop"; [ -n "$p" ] || exit 0; i=0; '
            f'while [ $i -lt {ticks} ]; do '
            # A pid left by a killed agent may belong to another process by now: check its command.
            'if [ -d /proc/self ]; then grep -qa muster_runner "/proc/$p/cmdline" 2>/dev/null || exit 0; '
            'else kill -0 "$p" 2>/dev/null || exit 0; fi; '
            'sleep 0.1; i=$((i+1)); done; exit 3'
        )
        status, out, err = self._exec(script, timeout=self.timeout + wait)
        if status == 3:
            raise RunnerError(f"the runner agent on {self.target.where} did not stop within {wait:g} s")
        if status != 0:
            raise RunnerError(self._failure("stop-agent", status, out, err))

    # --- registration helpers ---------------------------------------------------------------------

    def probe(self) -> dict[str, Any]:
        """The host's resources (see backends.ssh.probe) over this object's connection."""
        return self._with_client(lambda c: probe(c, timeout=self.timeout))

    def probe_docker(self, timeout: float | None = None) -> dict[str, Any] | None:
        """{version, runtimes} of the host's Docker daemon, or None (backends.ssh.probe.DOCKER_SCRIPT)."""
        return self._with_client(lambda c: probe_docker(c, timeout=timeout or self.timeout))

    def remote_host_key(self) -> str:
        """The host key the server presented, as "<keytype> <base64>", to record on first contact."""
        return self._with_client(connection.remote_host_key)
