"""Processes on the host, read from /proc where there is one: liveness, command lines, groups.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) from /proc, or None when the process does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[2])


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie counts as dead (its parent may never reap it)."""
    if pid <= 0:
        return False
    if os.path.isdir("/proc/self"):
        stat = proc_stat(pid)
        return stat is not None and stat[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_cmdline(pid: int) -> list[str] | None:
    """The argv of a process, or None when it cannot be read (no /proc, gone, or a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if not raw:
        return None
    return [part.decode("utf-8", "replace") for part in raw.rstrip(b"\0").split(b"\0")]


def is_runner_process(pid: int, command: str, job_id: str | None = None) -> bool:
    """Whether ``pid`` is a live muster_runner process running ``command`` (guards against pid reuse)."""
    if not pid_alive(pid):
        return False
    argv = pid_cmdline(pid)
    if argv is None:
        # No /proc (not Linux): being alive is all we can tell.
        return not os.path.isdir("/proc/self")
    if not any("muster_runner" in arg for arg in argv) or command not in argv:
        return False
    return job_id is None or job_id in argv


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is still in process group ``pgid``."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = proc_stat(int(name))
        if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
            return True
    return False


def marked_pids(marker: tuple[str, ...]) -> list[int]:
    """Live processes whose environment carries this job's marker, wherever their group or session.

    The marker is the job id and the runner home (``JobPaths.marker``): ids are UUIDs when the
    server submits, but two homes on one host may each hold a job ``j1`` of their own.
    Only processes of our own user can be read, which are the only ones a job can start (short of
    setuid programs, which a kill from us could not reach anyway).
    """
    if not os.path.isdir("/proc/self"):
        return []
    needles = [entry.encode() for entry in marker]
    own = os.getpid()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == own:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        entries = environ.split(b"\0")
        if all(needle in entries for needle in needles):
            stat = proc_stat(int(name))
            if stat is not None and stat[0] not in ("Z", "X"):
                pids.append(int(name))
    return pids


def signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_group_gone(pgid: int, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    """Wait until the group is empty, reaping ``proc`` meanwhile so our own child is not left a zombie."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None:
            proc.poll()
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def kill_group(pgid: int, grace: float, proc: subprocess.Popen | None = None) -> None:
    """SIGTERM the whole group, then SIGKILL whatever is left after ``grace`` seconds."""
    signal_group(pgid, signal.SIGTERM)
    if not wait_group_gone(pgid, grace, proc):
        signal_group(pgid, signal.SIGKILL)
        wait_group_gone(pgid, 2.0, proc)
