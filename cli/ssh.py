"""`muster ssh RUN [--job N] [-- COMMAND]`: a shell (or one command) in a job's environment.

The key is the user's attach key (cli/attach.py). The server grants it a line on the job's host
whose forced command is the runner's `shell` (runs/services/shell.py, runner/shell.py): the
command given here, or a login shell, in the job's container or beside its process with its env.
The command's exit status is this command's; 255 when the session ended without one (as ssh).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys

from cli.attach import connect, ensure_key, wait_until_installed, wait_until_started
from cli.client import Client, CliError
from cli.follow import say, segment

BUFFER = 32 << 10
NO_STATUS = 255


def _pump(channel) -> int:
    """stdin to the session, the session's stdout and stderr to ours, until it ends."""
    stdin = sys.stdin.fileno()
    reading = [channel, stdin]
    while True:
        ready = select.select(reading, [], [], 1)[0]
        while channel.recv_ready():
            os.write(sys.stdout.fileno(), channel.recv(BUFFER))
        while channel.recv_stderr_ready():
            os.write(sys.stderr.fileno(), channel.recv_stderr(BUFFER))
        if channel.exit_status_ready() and not (channel.recv_ready() or channel.recv_stderr_ready()):
            return channel.recv_exit_status()
        if channel.closed:
            return NO_STATUS
        if stdin in ready:
            data = os.read(stdin, BUFFER)
            if data:
                channel.sendall(data)
            else:  # our input ended: the far side sees its end, and may still answer
                channel.shutdown_write()
                reading.remove(stdin)


def _interactive(channel) -> int:
    import termios
    import tty

    size = shutil.get_terminal_size()
    channel.get_pty(term=os.environ.get("TERM", "xterm"), width=size.columns, height=size.lines)
    channel.invoke_shell()
    signal.signal(signal.SIGWINCH, lambda *_: channel.resize_pty(*shutil.get_terminal_size()))
    saved = termios.tcgetattr(sys.stdin.fileno())
    try:
        tty.setraw(sys.stdin.fileno())
        return _pump(channel)
    finally:
        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)


def ssh(client: Client, name: str, job_num: int, command: list[str]) -> int:
    wait_until_started(client, name, job_num)
    pkey, public = ensure_key()
    info = client.post(f"runs/{segment(name)}/ssh", {"job": job_num, "public_key": public})
    info = wait_until_installed(client, name, info)
    where = info["ssh"]
    transport = connect(where, pkey)
    try:
        channel = transport.open_session(timeout=30)
        if command:
            # joined as ssh joins its arguments: the far side's sh reads the line
            channel.exec_command(" ".join(command))
            status = _pump(channel)
        elif not sys.stdin.isatty():
            raise CliError("no command given and stdin is not a terminal: `muster ssh RUN -- COMMAND`")
        else:
            say(f"job {job_num} ({info.get('node_group_name')}/{info.get('node_group_rank')}) on "
                f"{info.get('ip')}; with OpenSSH: ssh -i ~/.muster/attach_key -p {where['port']} "
                f"{where['username']}@{where['hostname']}")
            status = _interactive(channel)
    finally:
        transport.close()
    return NO_STATUS if status < 0 else status
