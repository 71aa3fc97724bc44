"""How much output one remote command may print before it is stopped.

A host whose login shell (or ForceCommand, or ~/.bashrc) prints without end would otherwise grow
the server's memory until it dies, so every command run over SSH is capped; the cap and the check
live here so the runner host (which raises it for large reads) and the command loop share them.
"""

from __future__ import annotations

import paramiko
from django.conf import settings

from backends.ssh.connection import peer
from backends.ssh.errors import OutputTooLarge


def output_limit() -> int:
    return int(settings.MUSTER["SSH_OUTPUT_LIMIT"])


def check_output_size(client: paramiko.SSHClient, command: str, out: bytearray, err: bytearray, cap: int) -> None:
    if len(out) + len(err) > cap:
        raise OutputTooLarge(
            f"a command on {peer(client)} printed more than {cap} bytes, so it was stopped: {command[:60]!r}. "
            "Check that the login shell, ~/.bashrc or a ForceCommand on the host prints nothing by itself "
            "(MUSTER_SSH_OUTPUT_LIMIT sets the limit)"
        )

