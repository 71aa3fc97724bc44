"""The processes of one job, wherever they went: its cgroup, its environment marker, its group.

Where the host has a writable hierarchy, every job gets a cgroup of its own, which holds all its
processes whatever they do to their group, session or environment; the marker (JobPaths.marker)
finds them where there is none.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

from .files import JobPaths
from .processes import group_alive, marked_pids, pid_alive, signal_group, signal_pids


def _own_cgroups() -> dict[str, str]:
    """Controllers ("" for the v2 hierarchy) -> this process's cgroup path in that hierarchy."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) == 3:
                    found[parts[1]] = parts[2]
    except OSError:
        pass
    return found


def cgroup_parent() -> str | None:
    """A directory this process may create job cgroups in (v2 first, then v1 pids), or None."""
    own = _own_cgroups()
    candidates = []
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mountpoint, fstype, options = fields[3], fields[4], tail[0], tail[2].split(",")
        if fstype == "cgroup2" and "" in own:
            candidates.insert(0, (mountpoint, root, own[""]))
        elif fstype == "cgroup" and "pids" in options:
            path = next((p for c, p in own.items() if "pids" in c.split(",")), None)
            if path is not None:
                candidates.append((mountpoint, root, path))
    for mountpoint, root, path in candidates:
        # /proc/self/cgroup is relative to the hierarchy's root, the mount may show a subtree of it.
        if root != "/" and not (path + "/").startswith(root.rstrip("/") + "/"):
            continue
        relative = path[len(root):] if root != "/" else path
        directory = os.path.join(mountpoint, relative.lstrip("/"))
        if os.path.isfile(os.path.join(directory, "cgroup.procs")) and os.access(directory, os.W_OK):
            return directory
    return None


def create_job_cgroup(job: JobPaths) -> str:
    """The job's new cgroup directory, or "" where there is none to be had (the marker then serves)."""
    parent = cgroup_parent()
    if parent is None:
        return ""
    # Named by home and id: another home on this host may run a job of the same id.
    home = hashlib.sha256(job.home.encode()).hexdigest()[:12]
    path = os.path.join(parent, f"muster-{home}-{job.job_id}")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return ""
    return path


def cgroup_pids(cgroup: str) -> list[int]:
    if not cgroup:
        return []
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            pids = [int(line) for line in f if line.strip().isdigit()]
    except OSError:
        return []
    return [pid for pid in pids if pid != os.getpid() and pid_alive(pid)]


def remove_cgroup(cgroup: str, wait: float = 2.0) -> None:
    if not cgroup or not os.path.basename(cgroup).startswith("muster-"):
        return
    deadline = time.monotonic() + wait
    while True:
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError:
            # Busy while a killed orphan waits for init to reap it; cleanup tries once more.
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)


def job_tree_pids(marker: tuple[str, ...], pgid: int, cgroup: str = "") -> list[int]:
    pids = set(marked_pids(marker)) | set(cgroup_pids(cgroup))
    if pgid > 0 and group_alive(pgid):
        pids.add(-pgid)
    return sorted(pids)


def signal_job_tree(marker: tuple[str, ...], pgid: int, sig: int, cgroup: str = "") -> None:
    if pgid > 0:
        signal_group(pgid, sig)
    signal_pids(job_tree_pids(marker, 0, cgroup), sig)


def wait_job_tree_gone(
    marker: tuple[str, ...], pgid: int, timeout: float, proc: subprocess.Popen | None = None, cgroup: str = ""
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None:
            proc.poll()
        if not job_tree_pids(marker, pgid, cgroup):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def kill_job_tree(
    marker: tuple[str, ...], pgid: int, grace: float, proc: subprocess.Popen | None = None, cgroup: str = ""
) -> None:
    """SIGTERM every process of the job, its group and the ones that left it; SIGKILL after ``grace``.

    The process group alone misses ``setsid``, GNU ``timeout`` and daemons, which then keep ports
    and GPUs of a job that has ended; the job's cgroup and its environment marker follow them.
    """
    signal_job_tree(marker, pgid, signal.SIGTERM, cgroup)
    if not wait_job_tree_gone(marker, pgid, grace, proc, cgroup):
        # A process may fork between our scan and our signal; a few rounds catch what a fork bred.
        for _ in range(5):
            signal_job_tree(marker, pgid, signal.SIGKILL, cgroup)
            if wait_job_tree_gone(marker, pgid, 1.0, proc, cgroup):
                break
    remove_cgroup(cgroup)
