"""``shell``: the forced command of a shell key (`muster ssh`, runs/services/shell.py).

It runs the command the client asked for (``$SSH_ORIGINAL_COMMAND``), or an interactive shell
when there is none, in the job's environment: in the job's container when it has one (``docker
exec``: the container already holds the job's env, so nothing is written or passed), else beside
the job's process, with that process's own environment read from ``/proc/PID/environ`` (the
runner forgets secret values on disk once the job starts, runner/job.py, and they never go into a
process's arguments here: the environment is handed to ``execve``). The job's marker variables
come with it, so the job's end (runner/cgroups.py kill_job_tree) ends the shell too.

The shell's exit status is the session's. A revoked key's line is gone: a session opened on an
older connection is refused, and the revoke's ``pkill -f -- '--grant MARKER'`` (backends/ssh/
attach_keys.py) reaches this process, which then ends its child.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Any

from .cluster_env import base_env
from .containers import CONTAINER_WORKDIR, container_name
from .files import Paths, read_json
from .forward import granted

# an interactive login: bash when the host (or image) has it, else sh
INTERACTIVE = "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"
ENV_CAP = 1 << 20


def _refuse(message: str) -> int:
    sys.stderr.write(f"muster ssh: {message}\n")
    return 2


def process_env(pid: int) -> dict[str, str] | None:
    """The environment the job's process was started with, or None when it is gone."""
    try:
        with open(f"/proc/{int(pid)}/environ", "rb") as f:
            raw = f.read(ENV_CAP)
    except OSError:
        return None
    env = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def _argv(command: str, container: str | None) -> list[str]:
    script = command or INTERACTIVE
    if container is None:
        return ["/bin/sh", "-c", script]
    tty = ["-t"] if os.isatty(0) and os.isatty(1) else []
    return ["docker", "exec", "-i", *tty, "-w", CONTAINER_WORKDIR, "--", container, "/bin/sh", "-c", script]


def _run(argv: list[str], env: dict[str, str], cwd: str) -> int:
    """The child, ended with this process when the revoke's pkill (SIGTERM) or sshd's hangup
    reaches it; its exit status is ours."""
    child = subprocess.Popen(argv, env=env, cwd=cwd, close_fds=True)

    def end(signum: int, _frame: Any) -> None:
        try:
            child.send_signal(signal.SIGHUP)
            child.wait(2)
        except subprocess.TimeoutExpired:
            child.kill()
        except OSError:
            pass
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, end)
    code = child.wait()
    return code if code >= 0 else 128 - code


def cmd_shell(paths: Paths, job_id: str, keys: str = "", grant: str = "") -> int:
    if keys and grant and not granted(keys, grant):
        return _refuse("this key was revoked")
    job = paths.job(job_id)
    status = read_json(job.status) if os.path.exists(job.status) else {}
    if status.get("state") != "running":
        return _refuse(f"job {job_id} is not running on this host ({status.get('state') or 'not started'})")
    try:
        spec = read_json(job.spec)
    except (OSError, ValueError):
        spec = {}
    command = os.environ.get("SSH_ORIGINAL_COMMAND", "")
    if spec.get("container") is not None:
        if shutil.which("docker") is None:
            return _refuse("the job runs in a container and this host has no docker command")
        return _run(_argv(command, container_name(job_id)), base_env(paths.home), job.dir)
    env = process_env(status.get("pid") or 0)
    if env is None:
        return _refuse(f"job {job_id}'s process has ended")
    # the terminal the client asked for, which the job's own env (no terminal) does not name
    for key in ("TERM", "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return _run(_argv(command, None), env, job.workdir if os.path.isdir(job.workdir) else job.dir)
