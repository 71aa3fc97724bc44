"""Running commands and copying files on a host the server is connected to.

Separate from connecting (`connection`) because these are what every caller does many times over
one kept connection; both work over exec channels only (no SFTP), with a deadline and an output
cap on every command.
"""

from __future__ import annotations

import hashlib
import posixpath
import select
import shlex
import time
import uuid
from pathlib import Path

import paramiko

from backends.ssh.connection import peer
from backends.ssh.errors import HostUnreachable, SSHCommandTimeout, SSHError
from backends.ssh.output_limit import check_output_size, output_limit


def run(
    client: paramiko.SSHClient,
    command: str,
    timeout: float = 30,
    stdin: bytes | None = None,
    max_output: int | None = None,
) -> tuple[int, bytes, bytes]:
    """Run `command` through the remote user's shell; return (exit status, stdout, stderr).

    Output is drained while the command runs: waiting for the exit status first can deadlock once the
    remote side fills the channel window. More than `max_output` bytes (stdout and stderr together;
    default: the output limit setting) closes the channel and raises OutputTooLarge.
    """
    cap = output_limit() if max_output is None else max_output
    deadline = time.monotonic() + timeout
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise HostUnreachable(f"the SSH connection to {peer(client)} is closed")
    try:
        chan = transport.open_session(timeout=timeout)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise HostUnreachable(f"lost the SSH connection to {peer(client)}: {exc}") from exc
    out, err = bytearray(), bytearray()
    try:
        chan.settimeout(max(0.1, deadline - time.monotonic()))
        chan.exec_command(command)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        while True:
            while chan.recv_ready():
                out += chan.recv(65536)
                check_output_size(client, command, out, err, cap)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
                check_output_size(client, command, out, err, cap)
            if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                if not (chan.recv_ready() or chan.recv_stderr_ready()):
                    break
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SSHCommandTimeout(
                    f"command on {peer(client)} did not finish within {timeout:g} s: {command[:80]!r}"
                )
            select.select([chan], [], [], min(remaining, 0.5))
        return chan.recv_exit_status(), bytes(out), bytes(err)
    except TimeoutError as exc:  # socket.timeout from sendall on a stalled channel
        raise SSHCommandTimeout(
            f"command on {peer(client)} did not finish within {timeout:g} s: {command[:80]!r}"
        ) from exc
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostUnreachable(
            f"lost the SSH connection to {peer(client)} while running a command: {exc}"
        ) from exc
    finally:
        chan.close()


def put_file(
    client: paramiko.SSHClient,
    local: str | Path | bytes,
    remote_path: str,
    mode: int = 0o755,
    timeout: float = 30,
) -> None:
    """Copy a file (a path or the bytes themselves) over an exec channel, replacing `remote_path` atomically.

    No SFTP: many sshd setups leave out the sftp subsystem, and `cat` is everywhere. The data goes
    to a temporary name (created under umask 077, so nobody else can read it while it is written),
    its sha256 is checked on the host, and only then is it given `mode` and renamed into place, so a
    process reading the old file (for instance a running agent) never sees a half-written one.
    """
    data = local if isinstance(local, bytes) else Path(local).read_bytes()
    directory = posixpath.dirname(remote_path)
    tmp_path = posixpath.join(directory, f".{posixpath.basename(remote_path)}.{uuid.uuid4().hex}")
    digest = hashlib.sha256(data).hexdigest()
    tmp, final = shlex.quote(tmp_path), shlex.quote(remote_path)
    script = (
        f"umask 077; [ -d {shlex.quote(directory or '.')} ] || exit 71; "
        f"cat > {tmp} || {{ rm -f {tmp}; exit 72; }}; "
        f'[ "$(sha256sum {tmp} | cut -d" " -f1)" = {digest} ] || {{ rm -f {tmp}; exit 73; }}; '
        f"chmod {mode:o} {tmp} && mv -f {tmp} {final} || {{ rm -f {tmp}; exit 72; }}"
    )
    status, _out, err = run(client, script, timeout=timeout, stdin=data, max_output=64 << 10)
    where = f"{remote_path} on {peer(client)}"
    if status == 71:
        raise SSHError(f"cannot write {where}: its directory does not exist")
    if status == 72:
        raise SSHError(f"cannot write {where}: {err.decode(errors='replace').strip()[-300:] or 'permission denied'}")
    if status == 73:
        raise SSHError(f"copying {where} arrived damaged (sha256 differs); try again")
    if status != 0:
        raise SSHError(f"copying {where} failed with status {status}: {err.decode(errors='replace')[-300:]}")
