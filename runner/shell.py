"""``shell``: the forced command of a shell key (`muster ssh`, runs/services/shell.py).

It runs the command the client asked for (``$SSH_ORIGINAL_COMMAND``; from the dstack gateway, a
file it wrote under the runner home, `--command-file`, so the command is in no process's
arguments on the host), or an interactive shell
when there is none, in the job's environment: in the job's container when it has one (``docker
exec``: the container already holds the job's env, so nothing is written or passed), else beside
the job's process, with that process's own environment read from ``/proc/PID/environ`` (the
runner forgets secret values on disk once the job starts, runner/job.py, and they never go into a
process's arguments here: the environment is handed to ``execve``). The job's marker variables
come with it, so the job's end (runner/cgroups.py kill_job_tree) ends the shell too.

The shell's exit status is the session's. A revoked key's line is gone: a session opened on an
older connection is refused, and the revoke's ``pkill -f -- '--grant MARKER'`` (backends/ssh/
attach_keys.py) reaches this process, which then ends every process of the session
(runner/shell_session.py).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time

from . import shell_session as session
from .cluster_env import base_env
from .containers import container_name
from .files import Paths, read_json
from .forward import granted

ENV_CAP = 1 << 20
# the gateway's command files (backends/ssh/runner_host.py open_shell): a name is one token
COMMAND_NAME = re.compile(r"[0-9a-f]{32}")
STALE_COMMANDS = 600  # seconds: a file whose session never started


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


def commands_dir(paths: Paths) -> str:
    return os.path.join(paths.home, "shell-commands")


def take_command(paths: Paths, name: str) -> str | None:
    """The command the gateway left in file `name` (read once, then gone), or None. Older files of
    sessions that never started go too."""
    folder = commands_dir(paths)
    if not COMMAND_NAME.fullmatch(name):
        return None
    path = os.path.join(folder, name)
    try:
        with open(path, "rb") as f:
            command = f.read(ENV_CAP).decode("utf-8", "replace")
        os.unlink(path)
    except OSError:
        return None
    now = time.time()
    for other in os.listdir(folder):
        try:
            if now - os.stat(os.path.join(folder, other)).st_mtime > STALE_COMMANDS:
                os.unlink(os.path.join(folder, other))
        except OSError:
            pass
    return command


def cmd_shell(paths: Paths, job_id: str, keys: str = "", grant: str = "", command_file: str = "") -> int:
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
    if command_file:
        command = take_command(paths, command_file)
        if command is None:
            return _refuse(f"no command {command_file!r} on this host")
    else:
        command = os.environ.get("SSH_ORIGINAL_COMMAND", "")
    if spec.get("container") is not None:
        if shutil.which("docker") is None:
            return _refuse("the job runs in a container and this host has no docker command")
        return session.run(command, container_name(job_id), base_env(paths.home), job.dir)
    env = process_env(status.get("pid") or 0)
    if env is None:
        return _refuse(f"job {job_id}'s process has ended")
    # the terminal the client asked for, which the job's own env (no terminal) does not name
    for key in ("TERM", "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return session.run(command, None, env, job.workdir if os.path.isdir(job.workdir) else job.dir)
