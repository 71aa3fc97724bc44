"""`ssh <run>` after `dstack attach` (dstack's own way to a job's shell) through the gateway.

A session channel on a login for a running job, by a member who may change the project (the
writers `muster ssh` takes too): its shell or command runs in the job's environment on the job's
host through the runner's `shell` (runner/shell.py), over the server's own SSH connection to the
host (the one the engine uses: the fleet's key never leaves the server, and the user's dstack key
logs in only here). Every other session stays refused. The gateway's recheck closes the login
when access ends, which ends the session here and, with its channel, the shell on the host (and all
it started: runner/shell_session.py).
"""

from __future__ import annotations

import logging
import threading

import paramiko
from django.db import connection

from backends.registry import compute_for_instance, user_keys_over_ssh
from runs.services.attach import ATTACHABLE

log = logging.getLogger(__name__)
START_TIMEOUT = 30  # a session that asks for no shell or command within this is closed
BUFFER = 32 * 1024


class ShellRequest:
    """What the client asks on its session channel before the shell starts (terminal, command)."""

    def __init__(self) -> None:
        self.pty: tuple[str, int, int] | None = None
        self.command: str | None = None
        self.started = threading.Event()
        self.upstream = None

    def start(self, command: str | None) -> bool:
        if self.started.is_set():
            return False
        self.command = command
        self.started.set()
        return True

    def resize(self, width: int, height: int) -> bool:
        if self.upstream is not None:
            self.upstream.resize_pty(width=width, height=height)
        elif self.pty is not None:
            self.pty = (self.pty[0], width, height)
        return True


def allowed(grant) -> bool:
    """A shell for the login's job: writers only, the job on its host and running, the host one the
    server logs in to over SSH."""
    job = grant.job if grant is not None else None
    return bool(grant is not None and grant.ports and job.status in ATTACHABLE and job.instance is not None
                and user_keys_over_ssh(job.instance.backend))


def _to_client(upstream, chan, stderr: bool) -> None:
    recv, send = (upstream.recv_stderr, chan.sendall_stderr) if stderr else (upstream.recv, chan.sendall)
    try:
        while True:
            data = recv(BUFFER)
            if not data:
                break
            send(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass


def _to_host(chan, upstream) -> None:
    try:
        while True:
            data = chan.recv(BUFFER)
            if not data:  # the client's input ended: the host's side sees its end
                upstream.shutdown_write()
                return
            upstream.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass


def serve(chan, request: ShellRequest, job) -> None:
    """Bridge the client's session and the host's until either ends; the host's exit status is the
    client's. A client gone (its channel or login closed: the recheck closes a removed member's)
    closes the host's session, whose hangup ends the shell there. The caller closes `chan`."""
    if not request.started.wait(START_TIMEOUT):
        return
    host = None
    try:
        inst = type(job.instance).objects.select_related("fleet", "group").get(pk=job.instance_id)
        host = compute_for_instance(inst).runner_host(inst)
        connection.close()  # the bridge may last hours: it holds no database session
        request.upstream = upstream = host.open_shell(job.runner_job_id, request.command, request.pty)
        out = [threading.Thread(target=_to_client, args=(upstream, chan, err), daemon=True) for err in (False, True)]
        for thread in [*out, threading.Thread(target=_to_host, args=(chan, upstream), daemon=True)]:
            thread.start()
        while any(t.is_alive() for t in out):
            if chan.closed or not chan.get_transport().is_active():
                upstream.close()
                return
            out[0].join(1)
        out[1].join(5)
        chan.send_exit_status(upstream.recv_exit_status())
    except Exception as exc:  # noqa: BLE001  (paramiko and the backend raise several kinds; the user needs the line)
        log.info("dstack gateway: shell of job %s ended: %r", job.pk, exc)
        try:
            chan.sendall_stderr(f"muster: cannot open a shell on the job's host: {exc}\r\n".encode())
            chan.send_exit_status(255)
        except (OSError, EOFError, paramiko.SSHException):
            pass
    finally:
        if host is not None:
            host.close()
        connection.close()
