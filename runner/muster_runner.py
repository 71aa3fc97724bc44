#!/usr/bin/env python3
"""Muster runner: the agent that runs a job's commands on one host.

The server copies this single file to a host and drives it with short CLI calls over SSH (or as a
local subprocess).  It must therefore stay standard-library only and run on Python 3.8+.

Layout under the runner home directory HOME::

    HOME/agent.json, agent.pid, agent.lock, agent.log, agent.stop
    HOME/jobs/<job_id>/spec.json      written by the server (through ``submit``); the job runner
                                      rewrites it without env values once it has read them
    HOME/jobs/<job_id>/spec.sha256    digest of the spec as submitted (tells a resubmit from a clash)
    HOME/jobs/<job_id>/status.json    written by the runner, always atomically
    HOME/jobs/<job_id>/output.log     the commands' stdout + stderr, appended as produced
    HOME/jobs/<job_id>/runner.log     the job runner's own diagnostics
    HOME/jobs/<job_id>/mpi/hostfile
    HOME/jobs/<job_id>/workdir/       cwd of the commands
    HOME/jobs/<job_id>/stop           created by the server to request a stop
    HOME/jobs/<job_id>/container.env  a container job's env while ``docker create`` reads it (0600)

Commands: agent, ensure-agent, submit, status, stop, log, cleanup, job (internal).
Every command except ``log`` prints one JSON document on stdout.

Every command runs under umask 077: the home, job directories and files are the runner user's
alone (a spec holds secret values until its job starts; the output may print them).  Agents, job
runners and jobs start from a minimal environment (``base_env``), never the caller's: the caller
is a server worker or an SSH session whose variables (SECRET_KEY, DATABASE_URL) are not the job's.
Every process of a job carries ``MUSTER_JOB_ID=<job_id>`` and ``MUSTER_HOME=<home>`` in its
environment, and where the host has a writable cgroup hierarchy the job has a cgroup of its own
(``muster-<home hash>-<job_id>``), so a stop
finds the processes that left the job's process group (``setsid``, ``timeout``, daemons) too.

A spec with ``container.image`` runs as one Docker container (``run_container_job``), named by the
job id, through the host's ``docker`` CLI: the image is pulled unless present (state ``pulling``),
the container is created with host networking, the job's env and the MPI hostfile (read-only, at
the same path), then started attached so its output lands in output.log.  Stops use ``docker stop``
(SIGTERM, SIGKILL after the grace period) and every end removes the container.  Every docker
command puts ``--`` before its positional arguments, so an image or name is never read as a flag.
``container.policy`` is the fleet's (``allow_privileged``, ``allowed_prefixes``): a container that
asks for more, with the host paths' symlinks resolved, is refused (``policy_refusal``).
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import json
import os
import pwd
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

VERSION = "1"
HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_FRESH = 5.0
ENSURE_AGENT_WAIT = 5.0
DEFAULT_LOG_LIMIT = 1024 * 1024
DEFAULT_STOP_GRACE = 5.0
# A spec that fails to parse may still be in the middle of a non-atomic copy; only a spec that has
# stayed broken this long is declared failed.
SPEC_SETTLE_SECONDS = 2.0
# A job left in "starting" this long without a runner is considered abandoned (the agent died
# between writing the status and spawning the job runner).
STARTING_ABANDONED_AFTER = 60.0
WATCH_INTERVAL = 0.1
# A job's states in its status.json. The server reads them as RunnerState (runs/choices.py), and
# tests/test_vocabulary.py holds the two to the same words: this file is copied to hosts and run
# with the standard library only, so it cannot import the enum.
LIVE_STATES = ("submitted", "starting", "pulling", "running")  # its processes may be alive
FINAL_STATES = ("done", "failed", "terminated", "max_duration_exceeded")
STATES = LIVE_STATES + FINAL_STATES
JOB_MARKER = "MUSTER_JOB_ID"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SCRIPT_PATH = os.path.abspath(__file__)
DOCKER_CALL_TIMEOUT = 60.0  # one docker CLI call other than the pull and the job itself
DEFAULT_PULL_TIMEOUT = 600.0
DOCKER_MESSAGE_CAP = 2000  # characters of Docker's output kept for an error message
CONTAINER_WORKDIR = "/workflow"  # dstack's default working directory inside the container


# ---------------------------------------------------------------------------------------------
# Files


def write_json_atomic(path: str, data: Any) -> None:
    """Write JSON so that a reader sees either the old document or the new one, never a torn one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    """The parsed document, or None when the file is missing or not valid JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def create_exclusively(path: str, data: bytes) -> bool:
    """Publish ``data`` at ``path`` unless the file already exists; atomic against concurrent callers."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        # link() fails when the target exists, which gives create-if-absent without a torn file.
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:
        # Some filesystems refuse hard links; fall back to a check-then-replace.
        if os.path.exists(path):
            return False
        os.replace(tmp, path)
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def touch(path: str) -> None:
    with open(path, "a"):
        pass


def emit(data: Any) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


class Paths:
    """Where everything lives under one runner home."""

    def __init__(self, home: str) -> None:
        self.home = os.path.abspath(home)
        self.jobs = os.path.join(self.home, "jobs")
        self.agent_json = os.path.join(self.home, "agent.json")
        self.agent_pid = os.path.join(self.home, "agent.pid")
        self.agent_lock = os.path.join(self.home, "agent.lock")
        self.agent_log = os.path.join(self.home, "agent.log")
        self.agent_stop = os.path.join(self.home, "agent.stop")
        # Written with the last stop request of an instance being deleted (the server's stop-agent):
        # a home that has it starts no agent again, except for a registration (`--revive`), so a
        # look at a job that was in flight while its fleet went away cannot bring the agent back.
        self.retired = os.path.join(self.home, "retired")

    def job(self, job_id: str) -> JobPaths:
        return JobPaths(self.jobs, job_id)


class JobPaths:
    def __init__(self, jobs_dir: str, job_id: str) -> None:
        check_job_id(job_id)
        self.job_id = job_id
        self.dir = os.path.join(jobs_dir, job_id)
        self.spec = os.path.join(self.dir, "spec.json")
        self.spec_digest = os.path.join(self.dir, "spec.sha256")
        self.status = os.path.join(self.dir, "status.json")
        self.output = os.path.join(self.dir, "output.log")
        self.runner_log = os.path.join(self.dir, "runner.log")
        self.runner_lock = os.path.join(self.dir, "runner.lock")
        self.mpi_dir = os.path.join(self.dir, "mpi")
        self.hostfile = os.path.join(self.mpi_dir, "hostfile")
        self.workdir = os.path.join(self.dir, "workdir")
        self.stop = os.path.join(self.dir, "stop")
        self.home = os.path.dirname(os.path.abspath(jobs_dir))
        # In the environment of every process of the job (start_shell): how a stop finds them all.
        self.marker = (f"{JOB_MARKER}={job_id}", f"MUSTER_HOME={self.home}")


def check_job_id(job_id: str) -> None:
    # The id becomes a directory name; refuse anything that could escape HOME/jobs.
    if not job_id or job_id in (".", "..") or "/" in job_id or "\0" in job_id:
        raise ValueError(f"invalid job id: {job_id!r}")


# ---------------------------------------------------------------------------------------------
# Processes


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


# ---------------------------------------------------------------------------------------------
# Cgroups: where the host has a writable hierarchy, every job gets a cgroup of its own, which holds
# all its processes whatever they do to their group, session or environment.


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


# ---------------------------------------------------------------------------------------------
# Cluster environment (docs/how-it-works.md, "The cluster environment")


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def cluster_info(spec: dict[str, Any]) -> dict[str, Any]:
    info = spec.get("cluster_info")
    return info if isinstance(info, dict) else {}


def node_gpu_counts(spec: dict[str, Any]) -> list[int]:
    """GPUs of every node in rank order; without gpus_per_node every node is assumed like this one."""
    ips = cluster_info(spec).get("job_ips") or []
    per_node = cluster_info(spec).get("gpus_per_node") or []
    own = _int(spec.get("gpus"))
    return [_int(per_node[i]) if i < len(per_node) else own for i in range(len(ips))]


def hostfile_content(spec: dict[str, Any]) -> str:
    """One line per node: ``IP slots=N`` for GPU nodes, the bare IP for CPU nodes (never slots=0)."""
    ips = [str(ip or "") for ip in cluster_info(spec).get("job_ips") or []]
    if not ips or any(not ip for ip in ips):
        # An unknown address would make MPI launch on the wrong hosts; an empty file fails loudly instead.
        return ""
    counts = node_gpu_counts(spec)
    lines = [f"{ip} slots={counts[i]}" if counts[i] > 0 else ip for i, ip in enumerate(ips)]
    return "\n".join(lines) + "\n"


def total_gpus(spec: dict[str, Any]) -> int:
    per_node = cluster_info(spec).get("gpus_per_node") or []
    if per_node:
        return sum(_int(g) for g in per_node)
    return _int(spec.get("nodes_num"), 1) * _int(spec.get("gpus"))


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def cluster_env(spec: dict[str, Any], hostfile_path: str) -> dict[str, str]:
    """The variables the runner sets for the job, before the user's env is applied."""
    info = cluster_info(spec)
    env = {
        "DSTACK_NODE_RANK": _text(spec.get("job_num", 0)),
        "DSTACK_NODES_NUM": _text(spec.get("nodes_num", 1)),
        "DSTACK_NODES_IPS": "\n".join(_text(ip) for ip in info.get("job_ips") or []),
        "DSTACK_MASTER_NODE_IP": _text(info.get("master_job_ip")),
        "DSTACK_GPUS_PER_NODE": _text(_int(spec.get("gpus"))),
        "DSTACK_GPUS_NUM": _text(total_gpus(spec)),
        "DSTACK_MPI_HOSTFILE": os.path.abspath(hostfile_path),
        "DSTACK_RUN_NAME": _text(spec.get("run_name")),
        "DSTACK_JOB_NUM": _text(spec.get("job_num", 0)),
        "DSTACK_NODE_GROUP_NAME": _text(spec.get("node_group_name")),
        "DSTACK_NODE_GROUP_INDEX": _text(spec.get("node_group_index", 0)),
        "DSTACK_NODE_GROUP_RANK": _text(spec.get("node_group_rank", 0)),
        "DSTACK_NODE_IP": _text(spec.get("node_ip")),
    }
    tpu = spec.get("tpu")
    if isinstance(tpu, dict):
        hostnames = tpu.get("worker_hostnames")
        if isinstance(hostnames, list):
            hostnames = ",".join(_text(h) for h in hostnames)
        env["TPU_WORKER_ID"] = _text(tpu.get("worker_id", 0))
        env["TPU_WORKER_HOSTNAMES"] = _text(hostnames)
        env["PJRT_DEVICE"] = "TPU"
    return env


def base_env(runner_home: str) -> dict[str, str]:
    """The environment every runner process starts from: what a login would give, nothing inherited.

    PATH, HOME and LANG are the values taken over (hosts install python3 and CUDA tools in odd
    places, an SSH login sets HOME, and none of them is a secret); the user names come from the
    password database, which also gives HOME when the caller had none.
    """
    try:
        user = pwd.getpwuid(os.getuid())
        home, name = user.pw_dir, user.pw_name
    except KeyError:
        home, name = "/", str(os.getuid())
    env = {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": os.environ.get("HOME") or home,
        "USER": name,
        "LOGNAME": name,
        "SHELL": "/bin/sh",
        "LANG": os.environ.get("LANG") or "C.UTF-8",
        # The runner home (ssh-fleets.md: a host may set it); it tells every runner process apart.
        "MUSTER_HOME": runner_home,
    }
    if os.environ.get("DOCKER_HOST"):
        # Where the host's Docker daemon listens when not at the default socket; not a secret.
        env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    return env


def build_env(spec: dict[str, Any], base: dict[str, str], hostfile_path: str) -> dict[str, str]:
    """Runner environment, then the cluster contract, then the user's env (which wins)."""
    env = dict(base)
    # Without a terminal Python buffers stdout in blocks, so logs would arrive late; users expect live logs.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(cluster_env(spec, hostfile_path))
    user_env = spec.get("env") or {}
    for key, value in user_env.items():
        if value is not None:
            env[str(key)] = str(value)
    return env


def job_script(commands: list[str]) -> str:
    # set -e makes the first failing command fail the job, like a CI script.
    return "set -e\n" + "\n".join(commands) + "\n"


def validate_spec(spec: Any) -> dict[str, Any]:
    """The spec if it can be run; raises ValueError naming what is wrong."""
    if not isinstance(spec, dict):
        raise ValueError("spec must be a JSON object")
    commands = spec.get("commands")
    if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
        raise ValueError("spec.commands must be a list of strings")
    if spec.get("env") is not None and not isinstance(spec.get("env"), dict):
        raise ValueError("spec.env must be an object")
    for key in ("max_duration", "stop_grace"):
        value = spec.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"spec.{key} must be a number or null")
    container = spec.get("container")
    if container is not None:
        if not isinstance(container, dict) or not isinstance(container.get("image"), str) or not container["image"]:
            raise ValueError("spec.container must be an object with an image")
        volumes = container.get("volumes") or []
        if not isinstance(volumes, list) or not all(isinstance(v, str) for v in volumes):
            raise ValueError("spec.container.volumes must be a list of strings")
        policy = container.get("policy")
        if policy is not None and (not isinstance(policy, dict) or not isinstance(policy.get("allowed_prefixes", []), list)):
            raise ValueError("spec.container.policy must be an object with allowed_prefixes a list")
    return spec


# ---------------------------------------------------------------------------------------------
# Job runner (the ``job`` command)


class StopFlag:
    """Set by SIGTERM/SIGINT/SIGHUP so loops can finish cleanly instead of dying mid-write."""

    def __init__(self) -> None:
        self.set = False

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.set = True


def exit_fields(returncode: int) -> dict[str, Any]:
    """Shell-style exit status: 128+N when the shell was killed by signal N."""
    if returncode < 0:
        return {"exit_status": 128 - returncode, "signal": -returncode}
    return {"exit_status": returncode}


def stop_grace(spec: dict[str, Any]) -> float:
    grace = spec.get("stop_grace")
    return float(grace) if grace is not None else DEFAULT_STOP_GRACE


def final_state(returncode: int, reason: str | None) -> str:
    if reason is not None:
        return reason
    return "done" if returncode == 0 else "failed"


def prepare_job_dirs(job: JobPaths, spec: dict[str, Any]) -> None:
    os.makedirs(job.workdir, exist_ok=True)
    os.makedirs(job.mpi_dir, exist_ok=True)
    with open(job.hostfile, "w") as f:
        f.write(hostfile_content(spec))


def watch_job(
    job: JobPaths, proc: subprocess.Popen, spec: dict[str, Any], started: float, flag: StopFlag, cgroup: str
) -> str | None:
    """Wait for the shell to exit; returns the reason when we had to kill it, None when it exited alone."""
    max_duration = spec.get("max_duration")
    while proc.poll() is None:
        reason = None
        if flag.set or os.path.exists(job.stop):
            reason = "terminated"
        elif max_duration and time.monotonic() - started >= float(max_duration):
            reason = "max_duration_exceeded"
        if reason is not None:
            kill_job_tree(job.marker, proc.pid, stop_grace(spec), proc, cgroup)
            proc.wait()
            return reason
        time.sleep(WATCH_INTERVAL)
    return None


def start_shell(job: JobPaths, spec: dict[str, Any], cgroup: str) -> subprocess.Popen:
    env = build_env(spec, base_env(job.home), job.hostfile)
    # Set after the user's env so a job cannot drop or change them and escape its stop.
    env.update(entry.split("=", 1) for entry in job.marker)

    def enter_cgroup() -> None:
        # In the child before exec: the shell and everything it starts are in the cgroup from birth.
        try:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass  # the marker still finds the job's processes

    with open(job.output, "ab") as output:
        return subprocess.Popen(
            ["/bin/sh", "-c", job_script(spec["commands"])],
            preexec_fn=enter_cgroup if cgroup else None,
            cwd=job.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: a stop kills everything the job spawned
            close_fds=True,
        )


def forget_env_values(job: JobPaths, spec: dict[str, Any]) -> None:
    """Keep the env names only: secret values (and a registry password) leave the disk once the
    runner holds them in memory."""
    env = spec.get("env") or {}
    container = spec.get("container") if isinstance(spec.get("container"), dict) else None
    auth = container.get("registry_auth") if container else None
    if any(value is not None for value in env.values()) or (isinstance(auth, dict) and auth.get("password")):
        kept = dict(spec, env={str(key): None for key in env})
        if container is not None and isinstance(auth, dict):
            kept["container"] = dict(container, registry_auth={"username": auth.get("username")})
        write_json_atomic(job.spec, kept)


# ---------------------------------------------------------------------------------------------
# Container jobs


def container_name(job_id: str) -> str:
    # Job ids are UUIDs when the server submits; anything Docker would refuse is hashed instead.
    if re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", job_id):
        return job_id
    return "muster-" + hashlib.sha256(job_id.encode()).hexdigest()[:24]


def docker(args: list[str], timeout: float = DOCKER_CALL_TIMEOUT) -> tuple[int, str]:
    """(exit code, output capped) of one docker CLI call; 127 when there is no docker at all."""
    try:
        proc = subprocess.run(
            ["docker", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=base_env(os.environ.get("MUSTER_HOME") or "/"), timeout=timeout, close_fds=True,
        )
    except FileNotFoundError:
        return 127, "docker is not installed on this host"
    except subprocess.TimeoutExpired:
        return 124, f"docker {args[0]} did not answer within {timeout:.0f}s"
    out = proc.stdout.decode("utf-8", "replace").strip()
    return proc.returncode, out[-DOCKER_MESSAGE_CAP:]


def remove_container(name: str) -> None:
    docker(["rm", "-f", "--", name])


def container_env(spec: dict[str, Any], hostfile_path: str) -> dict[str, str]:
    """What the container is told: the cluster contract and the user's env, nothing of the host's."""
    env = {"PYTHONUNBUFFERED": "1"}
    env.update(cluster_env(spec, hostfile_path))
    for key, value in (spec.get("env") or {}).items():
        if value is not None:
            env[str(key)] = str(value)
    return env


def registry_of(image: str) -> str:
    """The registry an image reference names (its first component when that is a host), else Docker Hub."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "https://index.docker.io/v1/"


def pull_config(image: str, auth: Any) -> str:
    """A throw-away client configuration holding only this pull's credentials (dir 0700, file 0600).

    Never `docker login`: that writes ~/.docker/config.json, which would keep the password on the
    host and hand it to every other job of this user."""
    directory = tempfile.mkdtemp(prefix="muster-pull-")
    token = base64.b64encode(f"{auth.get('username') or ''}:{auth.get('password') or ''}".encode()).decode()
    fd = os.open(os.path.join(directory, "config.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"auths": {registry_of(image): {"auth": token}}}, f)
    return directory


def pull_image(job: JobPaths, image: str, timeout: float, flag: StopFlag, base: dict[str, Any],
               auth: Any = None) -> str | None:
    """Pull unless the host has the image; None when it is there, else why not ("terminated" on a stop)."""
    if docker(["image", "inspect", "--format", "{{.Id}}", "--", image])[0] == 0:
        return None
    status = dict(base, state="pulling", image=image, message=f"pulling {image}", time=time.time())
    write_json_atomic(job.status, status)
    env = base_env(job.home)
    config = pull_config(image, auth) if isinstance(auth, dict) and auth.get("password") else ""
    if config:
        env["DOCKER_CONFIG"] = config
    try:
        return _pull(job, image, timeout, flag, base, status, env)
    finally:
        if config:
            shutil.rmtree(config, ignore_errors=True)


def _pull(job: JobPaths, image: str, timeout: float, flag: StopFlag, base: dict[str, Any], status: dict[str, Any],
          env: dict[str, str]) -> str | None:
    try:
        proc = subprocess.Popen(
            ["docker", "pull", "--", image], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=env, close_fds=True,
        )
    except FileNotFoundError:
        return "docker is not installed on this host"
    deadline = time.monotonic() + timeout
    tail, buffer, layers, done = "", b"", set(), set()
    try:
        while True:
            if flag.set or os.path.exists(job.stop):
                return "terminated"
            if time.monotonic() >= deadline:
                return f"pulling {image} did not finish within {timeout:.0f}s"
            ready, _, _ = select.select([proc.stdout], [], [], WATCH_INTERVAL)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", "replace").strip()
                    tail = (tail + "\n" + line)[-DOCKER_MESSAGE_CAP:]
                    layer, _, what = line.partition(": ")
                    if what in ("Pulling fs layer", "Waiting", "Downloading", "Verifying Checksum"):
                        layers.add(layer)
                    elif what in ("Pull complete", "Already exists", "Download complete"):
                        layers.add(layer)
                        done.add(layer)
                if lines and layers:
                    message = f"pulling {image}: {len(done)}/{len(layers)} layers"
                    if message != status["message"]:
                        status = dict(status, message=message, time=time.time())
                        write_json_atomic(job.status, status)
        proc.wait(DOCKER_CALL_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    if proc.returncode != 0:
        return f"pulling {image} failed: {tail.strip() or f'docker pull exited with {proc.returncode}'}"
    # Kept in the statuses that follow: a pull shorter than the server's poll is still reported.
    base["pull_message"] = f"pulled {image}: {len(done)}/{len(layers)} layers"
    return None


def write_env_file(job: JobPaths, env: dict[str, str]) -> tuple[str, list[str]]:
    """An env file (0600) of the single-line values; the names of multi-line ones (an env file cannot
    hold a newline), which ``docker create -e NAME`` takes from its own environment instead."""
    path = os.path.join(job.dir, "container.env")
    inherited = [key for key, value in env.items() if "\n" in value or "\r" in value]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        for key, value in env.items():
            if key not in inherited:
                f.write(f"{key}={value}\n")
    return path, inherited


def nvidia_runtime() -> bool:
    """Whether this host's Docker can pass NVIDIA GPUs (nvidia-container-toolkit installed)."""
    if shutil.which("nvidia-container-runtime-hook") or shutil.which("nvidia-container-runtime"):
        return True
    code, out = docker(["info", "--format", "{{json .Runtimes}}"])
    return code == 0 and '"nvidia"' in out


def under(path: str, prefixes: list[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def policy_refusal(c: dict[str, Any]) -> tuple[str | None, list[str]]:
    """Why this host refuses the container under its fleet's policy (spec.container.policy, the
    operator's `allow_privileged` and `volumes.allowed_prefixes`), else None and the volumes with
    their host paths resolved. The server checked the written paths; only here are the host's
    symlinks known, so `/data/link -> /` or `/data/../etc` cannot reach past a prefix, and Docker
    is handed the resolved path, not the one that was checked. No policy: nothing is allowed."""
    policy = c.get("policy") if isinstance(c.get("policy"), dict) else {}
    if c.get("privileged") and policy.get("allow_privileged") is not True:
        return "this fleet does not allow privileged containers (its allow_privileged is false)", []
    prefixes = [os.path.realpath(p) for p in policy.get("allowed_prefixes") or []
                if isinstance(p, str) and p.startswith("/")]
    resolved = []
    for volume in c.get("volumes") or []:
        source, sep, target = volume.partition(":")
        if not sep or not source.startswith("/") or not target.startswith("/"):
            return f"volume {volume!r} is not /host/path:/container/path", []
        real = os.path.realpath(source)
        if not under(real, prefixes):
            allowed = ", ".join(prefixes) if prefixes else "none"
            return (f"this fleet does not allow mounting host path {source} (on this host: {real}): its "
                    f"volumes.allowed_prefixes are {allowed}"), []
        resolved.append(f"{real}:{target}")
    return None, resolved


def create_args(job: JobPaths, spec: dict[str, Any], name: str, env_file: str, inherited: list[str]) -> list[str]:
    c = spec["container"]
    args = [
        "create", "--name", name, "--label", f"muster.job={job.job_id}",
        # the job's host is its network: peers reach each other on the host addresses
        "--network", "host",
        # a PID 1 that forwards signals: `docker stop` then ends a shell that has no TERM handler
        "--init",
        "--env-file", env_file,
        "-v", f"{job.hostfile}:{job.hostfile}:ro",
        "-w", str(c.get("working_dir") or CONTAINER_WORKDIR),
    ]
    for key in inherited:
        args += ["-e", key]
    if c.get("privileged"):
        args.append("--privileged")
    if c.get("user"):
        args += ["--user", str(c["user"])]
    if c.get("shm_size"):
        args += ["--shm-size", f"{int(float(c['shm_size']) * 1024 ** 3)}b"]
    for volume in c.get("volumes") or []:
        args += ["-v", volume]
    gpus = c.get("gpus")
    if gpus == "nvidia" and nvidia_runtime():
        args += ["--gpus", "all"]  # a multi-node job has its host to itself
    elif gpus == "amd":
        args += ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video"]
    script = job_script(spec["commands"])
    entrypoint = shlex.split(str(c["entrypoint"])) if c.get("entrypoint") else []
    if entrypoint:
        args += ["--entrypoint", entrypoint[0], "--", c["image"], *entrypoint[1:]]
        if spec["commands"]:
            args += ["-c", script]
    else:
        args += ["--entrypoint", str(c.get("shell") or "/bin/sh"), "--", c["image"], "-c", script]
    return args


def run_container_job(job: JobPaths, spec: dict[str, Any], flag: StopFlag, base: dict[str, Any]) -> int:
    c = spec["container"]
    image, name = str(c["image"]), container_name(job.job_id)
    base = dict(base, container=name)

    def finish(state: str, fields: dict[str, Any]) -> int:
        remove_container(name)
        final = dict(base)
        final.update(fields)
        final.update(state=state, end_time=time.time())
        write_json_atomic(job.status, final)
        return 0

    # A container of this name is a leftover of an earlier runner of this job: never two of it.
    remove_container(name)
    refusal, volumes = policy_refusal(c)
    if refusal is not None:
        return finish("failed", {"reason": "creating_container_error", "error": refusal})
    spec = dict(spec, container=dict(c, volumes=volumes))
    timeout = float(c.get("pull_timeout") or DEFAULT_PULL_TIMEOUT)
    problem = pull_image(job, image, timeout, flag, base, c.get("registry_auth"))
    if problem == "terminated":
        return finish("terminated", {"exit_status": None})
    if problem is not None:
        return finish("failed", {"reason": "creating_container_error", "error": problem})
    env = container_env(spec, job.hostfile)
    env_file, inherited = write_env_file(job, env)
    try:
        caller_env = dict(base_env(job.home), **{k: env[k] for k in inherited})
        create_args_used = create_args(job, spec, name, env_file, inherited)
        try:
            proc = subprocess.run(
                ["docker", *create_args_used], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=caller_env, timeout=DOCKER_CALL_TIMEOUT,
                close_fds=True,
            )
            code, out = proc.returncode, proc.stdout.decode("utf-8", "replace").strip()[-DOCKER_MESSAGE_CAP:]
        except subprocess.TimeoutExpired:
            code, out = 124, f"docker create did not answer within {DOCKER_CALL_TIMEOUT:.0f}s"
    finally:
        # The daemon holds the env from here on; the values do not stay on the host's disk.
        os.unlink(env_file)
    if code != 0:
        return finish("failed", {"reason": "creating_container_error", "error": f"creating the container failed: {out}"})
    with open(job.output, "ab") as output:
        if c.get("gpus") == "nvidia" and "--gpus" not in create_args_used:
            # Said in the job's own log: commands that expect GPUs would otherwise fail far from the cause.
            output.write(b"muster: this host's Docker has no NVIDIA runtime (install nvidia-container-toolkit); "
                         b"the container runs without GPUs\n")
            output.flush()
        attached = subprocess.Popen(
            ["docker", "start", "--attach", "--", name], stdin=subprocess.DEVNULL, stdout=output, stderr=output,
            env=base_env(job.home), start_new_session=True, close_fds=True,
        )
    started = time.monotonic()
    running = dict(base, state="running", pid=attached.pid, start_time=time.time())
    write_json_atomic(job.status, running)
    reason = None
    max_duration = spec.get("max_duration")
    while attached.poll() is None:
        if flag.set or os.path.exists(job.stop):
            reason = "terminated"
        elif max_duration and time.monotonic() - started >= float(max_duration):
            reason = "max_duration_exceeded"
        if reason is not None:
            grace = stop_grace(spec)
            docker(["stop", "-t", str(max(0, int(round(grace)))), "--", name], timeout=grace + DOCKER_CALL_TIMEOUT)
            break
        time.sleep(WATCH_INTERVAL)
    try:
        attached.wait(DOCKER_CALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        attached.kill()
        attached.wait()
    code, out = docker(["inspect", "--format", "{{.State.ExitCode}}|{{.State.Error}}", "--", name])
    status_text, _, error = out.partition("|")
    if code == 0 and error.strip() and reason is None:
        # The runtime could not start the process (caps, devices, a missing shell): not the commands' exit.
        return finish("failed", {"reason": "creating_container_error",
                                 "error": f"starting the container failed: {error.strip()}"})
    exit_status = int(status_text) if code == 0 and status_text.lstrip("-").isdigit() else attached.returncode
    return finish(final_state(exit_status, reason), dict(running, **exit_fields(exit_status)))


def run_job(home: str, job_id: str) -> int:
    job = Paths(home).job(job_id)
    # Held until this process exits: a second runner for the same job would run it twice.
    lock = open(job.runner_lock, "a")
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log_err(f"job {job_id} already has a runner")
        return 1
    flag = StopFlag()
    flag.install()
    base = {"runner_pid": os.getpid()}
    try:
        spec = validate_spec(read_json(job.spec))
        forget_env_values(job, spec)
        if os.path.exists(job.stop) or flag.set:
            write_json_atomic(
                job.status, dict(base, state="terminated", exit_status=None, end_time=time.time())
            )
            return 0
        prepare_job_dirs(job, spec)
        if spec.get("container") is not None:
            return run_container_job(job, spec, flag, base)
        # `"cgroup": false` in a spec keeps the job out of cgroups (the marker alone then stops it).
        cgroup = create_job_cgroup(job) if spec.get("cgroup", True) is not False else ""
        proc = start_shell(job, spec, cgroup)
    except (OSError, ValueError) as e:
        remove_cgroup(locals().get("cgroup", ""))
        write_json_atomic(
            job.status, dict(base, state="failed", error=f"cannot start: {e}", end_time=time.time())
        )
        return 1
    started = time.monotonic()
    running = dict(base, state="running", pid=proc.pid, pgid=proc.pid, cgroup=cgroup, start_time=time.time())
    write_json_atomic(job.status, running)
    reason = watch_job(job, proc, spec, started, flag, cgroup)
    # Background children (`server &`, daemons) outlive the shell; a finished job must not leak them.
    kill_job_tree(job.marker, proc.pid, stop_grace(spec), proc, cgroup)
    final = dict(running, state=final_state(proc.returncode, reason), end_time=time.time())
    final.update(exit_fields(proc.returncode))
    write_json_atomic(job.status, final)
    return 0


def log_err(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    sys.stderr.write(f"{stamp} muster_runner[{os.getpid()}]: {message}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# Agent (the ``agent`` command)


class Agent:
    def __init__(self, paths: Paths, poll: float) -> None:
        self.paths = paths
        self.poll = poll
        self.flag = StopFlag()
        self.children: dict[str, subprocess.Popen] = {}
        self.started = time.time()
        self.last_heartbeat = 0.0

    def run(self) -> int:
        private_home(self.paths)
        lock = open(self.paths.agent_lock, "a")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            # Another agent owns this home; two would start every job twice.
            log_err(f"another agent holds {self.paths.agent_lock}; exiting")
            return 0
        self.flag.install()
        self.heartbeat()
        write_json_atomic(self.paths.agent_pid, os.getpid())
        log_err(f"agent started (home {self.paths.home})")
        # `retired` too: an ensure-agent that passed its check just before the home was retired
        # (and took the stop request away) must not leave an agent running there.
        while (not self.flag.set and not os.path.exists(self.paths.agent_stop)
               and not os.path.exists(self.paths.retired)):
            self.tick()
            time.sleep(self.poll)
        self.shutdown()
        return 0

    def tick(self) -> None:
        # Each step is guarded: one broken job directory must never take the agent down.
        for step in (self.start_new_jobs, self.reap_children, self.fail_orphans):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - the agent must survive anything a job dir holds
                log_err(f"{step.__name__}: {e!r}")
        if time.time() - self.last_heartbeat >= HEARTBEAT_INTERVAL:
            self.heartbeat()

    def heartbeat(self) -> None:
        self.last_heartbeat = time.time()
        write_json_atomic(
            self.paths.agent_json,
            {
                "pid": os.getpid(),
                "version": VERSION,
                "started": self.started,
                "heartbeat": self.last_heartbeat,
            },
        )

    def job_ids(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.paths.jobs))
        except OSError:
            return []
        return [n for n in names if os.path.isdir(os.path.join(self.paths.jobs, n))]

    def start_new_jobs(self) -> None:
        for job_id in self.job_ids():
            job = self.paths.job(job_id)
            if os.path.exists(job.spec) and not os.path.exists(job.status):
                try:
                    self.start_job(job)
                except OSError as e:
                    # Typically the directory was removed by cleanup while we looked at it.
                    log_err(f"cannot start job {job_id}: {e}")

    def start_job(self, job: JobPaths) -> None:
        spec = read_json(job.spec)
        try:
            validate_spec(spec)
        except ValueError as e:
            if time.time() - os.path.getmtime(job.spec) < SPEC_SETTLE_SECONDS:
                return  # maybe still being copied; look again next poll
            write_json_atomic(
                job.status, {"state": "failed", "error": f"bad spec: {e}", "end_time": time.time()}
            )
            return
        # Written before spawning so a restarted agent never starts the same job twice.
        write_json_atomic(job.status, {"state": "starting", "time": time.time()})
        with open(job.runner_log, "ab") as runner_log:
            self.children[job.job_id] = subprocess.Popen(
                [sys.executable, SCRIPT_PATH, "job", "--home", self.paths.home, "--job", job.job_id],
                env=base_env(self.paths.home),
                stdin=subprocess.DEVNULL,
                stdout=runner_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # jobs survive agent restarts and signals sent to the agent
                close_fds=True,
            )
        log_err(f"started job {job.job_id} (runner pid {self.children[job.job_id].pid})")

    def reap_children(self) -> None:
        for job_id, proc in list(self.children.items()):
            if proc.poll() is None:
                continue
            del self.children[job_id]
            self.fail_if_unfinished(self.paths.job(job_id), f"job runner exited with code {proc.returncode}")

    def fail_orphans(self) -> None:
        """Fail jobs whose runner died without a final status (killed, OOM, host agent restarted)."""
        for job_id in self.job_ids():
            if job_id in self.children:
                continue
            job = self.paths.job(job_id)
            status = read_json(job.status)
            if not isinstance(status, dict):
                continue
            if status.get("state") in ("running", "pulling") and not is_runner_process(
                _int(status.get("runner_pid")), "job", job_id
            ):
                self.fail_if_unfinished(job, "job runner died")
            elif status.get("state") == "starting" and not job_is_active(job, status):
                self.fail_if_unfinished(job, "job runner never started")

    def fail_if_unfinished(self, job: JobPaths, error: str) -> None:
        # Re-read: the runner writes its final status before exiting, so a fresh read decides.
        status = read_json(job.status)
        if not isinstance(status, dict) or status.get("state") in FINAL_STATES:
            return
        kill_job_tree(job.marker, _int(status.get("pgid")), 0.5, cgroup=_job_cgroup(status))
        if isinstance(status.get("container"), str):
            remove_container(status["container"])
        failed = dict(status, state="failed", error=error, end_time=time.time())
        if os.path.isdir(job.dir):
            write_json_atomic(job.status, failed)
            log_err(f"job {job.job_id} failed: {error}")

    def shutdown(self) -> None:
        log_err("agent stopping")
        if os.path.exists(self.paths.agent_stop):
            try:
                os.unlink(self.paths.agent_stop)
            except OSError:
                pass
        if read_json(self.paths.agent_pid) == os.getpid():
            os.unlink(self.paths.agent_pid)
        agent = read_json(self.paths.agent_json) or {}
        if agent.get("pid") == os.getpid():
            write_json_atomic(self.paths.agent_json, dict(agent, stopped=time.time()))


# ---------------------------------------------------------------------------------------------
# Server-facing commands


def read_agent_pid(paths: Paths) -> int:
    return _int(read_json(paths.agent_pid))


def heartbeat_fresh(agent: Any, now: float) -> bool:
    return isinstance(agent, dict) and now - float(agent.get("heartbeat") or 0) < HEARTBEAT_FRESH


def live_agent_pid(paths: Paths) -> int | None:
    pid = read_agent_pid(paths)
    if pid <= 0:
        return None
    if os.path.isdir("/proc/self"):
        return pid if is_runner_process(pid, "agent") else None
    # Without /proc a reused pid cannot be told apart; a fresh heartbeat shows the agent is ours.
    return pid if pid_alive(pid) and heartbeat_fresh(read_json(paths.agent_json), time.time()) else None


def private_home(paths: Paths) -> None:
    os.makedirs(paths.jobs, exist_ok=True)
    # A home made before umask 077 (or by the server with its own umask) is closed here.
    for path in (paths.home, paths.jobs):
        os.chmod(path, 0o700)


def cmd_ensure_agent(paths: Paths, revive: bool = False) -> int:
    private_home(paths)
    pid = live_agent_pid(paths)
    if pid is not None:
        emit({"started": False, "pid": pid})
        return 0
    if os.path.exists(paths.retired):
        if not revive:
            emit({"started": False, "pid": None,
                  "error": "this runner home is retired: its instance was deleted (register the host again)"})
            return 1
        os.unlink(paths.retired)
    if os.path.exists(paths.agent_stop):
        os.unlink(paths.agent_stop)  # a stale stop request would make the new agent exit at once
    with open(paths.agent_log, "ab") as agent_log:
        proc = subprocess.Popen(
            [sys.executable, SCRIPT_PATH, "agent", "--home", paths.home],
            env=base_env(paths.home),
            stdin=subprocess.DEVNULL,
            stdout=agent_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # detached: the SSH session that called us can return now
            close_fds=True,
            cwd=paths.home,
        )
    deadline = time.monotonic() + ENSURE_AGENT_WAIT
    while time.monotonic() < deadline:
        pid = live_agent_pid(paths)
        if pid is not None:
            # Under a concurrent call the other caller's agent may have won the lock; ours then exited.
            emit({"started": pid == proc.pid, "pid": pid})
            return 0
        if proc.poll() not in (None, 0):
            break  # crashed (a lock loser exits 0 and the winner is still coming up)
        time.sleep(0.05)
    emit({"started": False, "pid": None, "error": f"agent did not come up; see {paths.agent_log}"})
    return 1


def spec_digest(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def cmd_submit(paths: Paths, job_id: str) -> int:
    job = paths.job(job_id)
    raw = sys.stdin.buffer.read()
    try:
        spec = validate_spec(json.loads(raw.decode("utf-8")))
    except ValueError as e:
        emit({"submitted": False, "error": f"bad spec: {e}"})
        return 1
    os.makedirs(job.dir, exist_ok=True)
    digest = spec_digest(spec)
    # The digest is published first and alone decides: the spec itself loses its env values once
    # the job starts, and two concurrent submits must agree on one winner.
    if not create_exclusively(job.spec_digest, digest.encode()):
        try:
            with open(job.spec_digest) as f:
                existing = f.read().strip()
        except OSError:
            existing = ""
        if existing != digest:
            # Someone else's job under this id (or a changed spec): accepting it would show that
            # job's output and status as this one's.
            emit({"submitted": False, "error": f"job {job_id} already exists with a different spec"})
            return 1
        emit({"submitted": False})
        return 0
    emit({"submitted": create_exclusively(job.spec, raw)})
    return 0


def job_status(job: JobPaths) -> dict[str, Any] | None:
    status = read_json(job.status)
    if isinstance(status, dict):
        return status
    if os.path.exists(job.spec):
        return {"state": "submitted"}
    return None


def cmd_status(paths: Paths) -> int:
    emit(status_report(paths))
    return 0


def status_report(paths: Paths) -> dict[str, Any]:
    """What ``status`` prints; reads files and /proc only (the local backend calls it in-process)."""
    now = time.time()
    agent = read_json(paths.agent_json)
    pid = _int(agent.get("pid")) if isinstance(agent, dict) else 0
    alive = pid > 0 and is_runner_process(pid, "agent") and heartbeat_fresh(agent, now)
    jobs: dict[str, Any] = {}
    if os.path.isdir(paths.jobs):
        for job_id in sorted(os.listdir(paths.jobs)):
            try:
                status = job_status(paths.job(job_id))
            except ValueError:
                continue
            if status is not None:
                # How much the job has printed: the server fetches only what it has not copied yet.
                try:
                    status["log_size"] = os.path.getsize(paths.job(job_id).output)
                except OSError:
                    status["log_size"] = 0
                jobs[job_id] = status
    return {"now": now, "agent": agent if isinstance(agent, dict) else None, "agent_alive": alive, "jobs": jobs}


def cmd_stop(paths: Paths, job_id: str) -> int:
    job = paths.job(job_id)
    if not os.path.isdir(job.dir):
        emit({"stopping": False, "error": "unknown job"})
        return 0
    touch(job.stop)
    emit({"stopping": True})
    return 0


def cmd_log(paths: Paths, job_id: str, offset: int, limit: int) -> int:
    job = paths.job(job_id)
    out = sys.stdout.buffer
    try:
        f = open(job.output, "rb")
    except FileNotFoundError:
        return 0
    with f:
        f.seek(offset)
        remaining = limit
        while remaining > 0:
            chunk = f.read(min(remaining, 64 * 1024))
            if not chunk:
                break
            out.write(chunk)
            remaining -= len(chunk)
    out.flush()
    return 0


def job_is_active(job: JobPaths, status: dict[str, Any] | None) -> bool:
    if status is None or status.get("state") in FINAL_STATES + ("submitted",):
        return False
    if status.get("state") == "starting":
        return time.time() - float(status.get("time") or 0) < STARTING_ABANDONED_AFTER
    return is_runner_process(_int(status.get("runner_pid")), "job", job.job_id)


def _job_cgroup(status: dict[str, Any]) -> str:
    cgroup = status.get("cgroup")
    # status.json is ours, but only a job cgroup we named is ever signalled or removed.
    return cgroup if isinstance(cgroup, str) and os.path.basename(cgroup).startswith("muster-") else ""


def cmd_cleanup(paths: Paths, job_id: str) -> int:
    job = paths.job(job_id)
    if not os.path.isdir(job.dir):
        emit({"removed": False, "reason": "no such job"})
        return 0
    status = job_status(job)
    if job_is_active(job, status):
        emit({"removed": False, "reason": "job is " + str(status["state"])})
        return 0
    # A runner that died, or one that finished while a daemon of its job still lingers: nothing of
    # the job may outlive its directory.
    status = status or {}
    # A finished job's group id may belong to someone else by now; its marker cannot.
    pgid = _int(status.get("pgid")) if status.get("state") not in FINAL_STATES else 0
    kill_job_tree(job.marker, pgid, 0.5, cgroup=_job_cgroup(status))
    if isinstance(status.get("container"), str):
        remove_container(status["container"])
    shutil.rmtree(job.dir, ignore_errors=True)
    emit({"removed": True})
    return 0


# ---------------------------------------------------------------------------------------------
# Attach forwarding

FORWARD_BUFFER = 64 << 10


def _granted(keys: str, grant: str) -> bool:
    try:
        with open(os.path.expanduser(keys), encoding="utf-8", errors="replace") as f:
            return any(line.rstrip("\n").endswith(" " + grant) for line in f)
    except OSError:
        return False


def cmd_forward(ip: str, ports: str, keys: str = "", grant: str = "") -> int:
    """The forced command of an attach key (runs/services/attach.py): stdin/stdout to ip:PORT,
    PORT being what the client asked to run, and only one of `ports`.

    The key has no port forwarding at all: sshd's permitlisten cannot hold a Unix-socket -R
    (OpenSSH 9.2 matches any path against a non-empty list), so the bytes go through this
    session's own stdin/stdout instead of a forwarded channel.
    """
    wanted = os.environ.get("SSH_ORIGINAL_COMMAND", "").strip()
    allowed = [p for p in ports.split(",") if p.isdigit()]
    if keys and grant and not _granted(keys, grant):
        # the line is gone (revoked) but this SSH connection was made before: no new session
        sys.stderr.write("muster attach: this key was revoked\n")
        return 2
    if wanted not in allowed:
        sys.stderr.write(f"muster attach: this key reaches port {','.join(allowed)} of {ip} only\n")
        return 2
    try:
        conn = socket.create_connection((ip, int(wanted)), timeout=10)
    except OSError as e:
        sys.stderr.write(f"muster attach: cannot connect to {ip}:{wanted}: {e}\n")
        return 1
    conn.settimeout(None)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    reading = [stdin, conn]
    while reading:
        for ready in select.select(reading, [], [])[0]:
            if ready is conn:
                data = conn.recv(FORWARD_BUFFER)
                if not data:
                    return 0
                while data:
                    data = data[os.write(stdout, data):]
            else:
                data = os.read(stdin, FORWARD_BUFFER)
                if not data:  # the client is done sending: the job may still answer
                    conn.shutdown(socket.SHUT_WR)
                    reading.remove(stdin)
                else:
                    conn.sendall(data)
    return 0


# CLI


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


# command -> (needs --job, help)
COMMANDS = {
    "agent": (False, "long-lived loop that starts submitted jobs"),
    "ensure-agent": (False, "start the agent unless one is alive; prints {started, pid}"),
    "submit": (True, "store the spec read from stdin unless the job exists; prints {submitted}"),
    "status": (False, "print the agent and every job's status as one JSON document"),
    "stop": (True, "ask a job to stop; prints {stopping}"),
    "log": (True, "write raw bytes of a job's output.log to stdout"),
    "cleanup": (True, "remove a job's directory unless it is running; prints {removed}"),
    "job": (True, "internal: run one job (spawned by the agent)"),
    "forward": (False, "internal: an attach key's forced command, stdin/stdout to --to:$SSH_ORIGINAL_COMMAND"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="muster_runner.py", description="Muster runner agent")
    sub = parser.add_subparsers(dest="command")
    sub.required = True
    for name, (needs_job, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        command.add_argument("--home", required=True)
        if needs_job:
            command.add_argument("--job", required=True)
        if name == "agent":
            command.add_argument("--poll", type=float, default=0.2)
        if name == "ensure-agent":
            command.add_argument("--revive", action="store_true", help="start it even in a retired home")
        if name == "forward":
            command.add_argument("--to", required=True)
            command.add_argument("--ports", required=True)
            command.add_argument("--keys", default="", help="the authorized_keys file holding the grant's line")
            command.add_argument("--grant", default="", help="the line's marker: gone means revoked")
        if name == "log":
            command.add_argument("--offset", type=non_negative, default=0)
            command.add_argument("--limit", type=non_negative, default=DEFAULT_LOG_LIMIT)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.umask(0o077)
    args = build_parser().parse_args(argv)
    paths = Paths(args.home)
    try:
        if args.command == "agent":
            return Agent(paths, args.poll).run()
        if args.command == "ensure-agent":
            return cmd_ensure_agent(paths, args.revive)
        if args.command == "status":
            return cmd_status(paths)
        if args.command == "submit":
            return cmd_submit(paths, args.job)
        if args.command == "stop":
            return cmd_stop(paths, args.job)
        if args.command == "log":
            return cmd_log(paths, args.job, args.offset, args.limit)
        if args.command == "cleanup":
            return cmd_cleanup(paths, args.job)
        if args.command == "job":
            return run_job(paths.home, args.job)
        if args.command == "forward":
            return cmd_forward(args.to, args.ports, args.keys, args.grant)
    except ValueError as e:
        emit({"error": str(e)})
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
