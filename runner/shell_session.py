"""One `shell` session's processes (runner/shell.py): started under a marker of their own, and all
ended with the session, however they left its process group.

A revoke (the pkill on `--grant MARKER`, backends/ssh/attach_keys.py) or sshd's hangup reaches only
the `shell` process; its child alone would leave `setsid`/`nohup` descendants running, and on a
container job the child is the `docker exec` client, whose end does not end what it started inside
the container. So every process of the session carries ``MUSTER_SHELL=<token>`` in its environment,
and the session's end (revoke, hangup, or its command done) signals every process that carries it:
on the host through /proc (runner/cgroups.py kill_job_tree, as a job's own end), in a container by
one more ``docker exec`` that does the same scan inside it. A process that clears its own
environment and leaves the group is out of reach (the job's end still takes it on a host with
cgroups, and the container's end takes it there).

The command itself travels in the environment (``MUSTER_SHELL_COMMAND``, unset before it runs),
never in a process's arguments: anyone on the host may read those (`ps`), only the fleet user its
environment.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import uuid
from typing import Any

from .cgroups import kill_job_tree
from .containers import CONTAINER_WORKDIR

MARKER = "MUSTER_SHELL"
COMMAND = "MUSTER_SHELL_COMMAND"
# an interactive login: bash when the host (or image) has it, else sh
INTERACTIVE = "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"
# the command out of the environment its processes inherit, then run as `sh -c` would
RUN_COMMAND = f'c=${COMMAND}; unset {COMMAND}; eval "$c"'
GRACE = 2.0
DOCKER_TIMEOUT = 15
# Inside the container: TERM, then KILL, every process carrying the marker ($1). The scan's own
# processes do not carry it (the token is an argument here, not an environment entry).
CONTAINER_KILL = (
    'for s in TERM KILL KILL KILL; do n=0; for p in /proc/[0-9]*; do '
    'grep -qzxF "MUSTER_SHELL=$1" "$p/environ" 2>/dev/null && kill -s $s "${p#/proc/}" 2>/dev/null && n=1; '
    'done; [ $n = 0 ] && exit 0; sleep 1; done'
)


def new_marker() -> str:
    return uuid.uuid4().hex


def argv(container: str | None, tty: bool) -> list[str]:
    if container is None:
        return ["/bin/sh", "-c", RUN_COMMAND]
    # `-e NAME` without a value: docker takes it from its own environment, not its arguments
    return ["docker", "exec", "-i", *(["-t"] if tty else []), "-e", MARKER, "-e", COMMAND,
            "-w", CONTAINER_WORKDIR, "--", container, "/bin/sh", "-c", RUN_COMMAND]


def _end(child: subprocess.Popen, token: str, container: str | None, tty: bool) -> None:
    if container is None:
        # no terminal: the child leads a group of its own (see run); with one it stays in ours,
        # the terminal's foreground, and the marker finds it and all it started
        kill_job_tree((f"{MARKER}={token}",), 0 if tty else child.pid, GRACE, child)
        return
    try:
        subprocess.run(["docker", "exec", "--", container, "/bin/sh", "-c", CONTAINER_KILL, "sh", token],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=DOCKER_TIMEOUT + 5 * GRACE, close_fds=True)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        child.wait(GRACE)
    except subprocess.TimeoutExpired:
        child.kill()


def _wait(child: subprocess.Popen, tty: bool) -> int:
    """The child's exit status; without a terminal, -SIGHUP as soon as our stdout has no reader:
    sshd closed the session (its client went, or the gateway closed it) but, with no terminal to
    hang up, signals nothing."""
    if tty:
        return child.wait()
    poller = select.poll()
    poller.register(1, select.POLLERR | select.POLLHUP)
    while True:
        try:
            return child.wait(1)
        except subprocess.TimeoutExpired:
            pass
        if any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0)):
            return -signal.SIGHUP


def run(command: str, container: str | None, env: dict[str, str], cwd: str) -> int:
    """The session's command (a login shell when empty) under a fresh marker; whatever it started is
    ended when the command ends, or when the revoke's SIGTERM or sshd's SIGHUP reaches this process.
    The command's exit status is ours."""
    tty = os.isatty(0) and os.isatty(1)
    token = new_marker()
    env = {**env, MARKER: token, COMMAND: command or INTERACTIVE}
    # without a terminal the child leads a group of its own, which a signal to it then reaches whole
    child = subprocess.Popen(argv(container, tty), env=env, cwd=cwd, close_fds=True,
                             start_new_session=container is None and not tty)

    def ended(signum: int, _frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        _end(child, token, container, tty)
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, ended)
    code = _wait(child, tty)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    _end(child, token, container, tty)
    return code if code >= 0 else 128 - code
