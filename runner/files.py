"""Files under the runner home: where each one lives, and how they are written and read.

Layout under the runner home directory HOME::

    HOME/bin/muster_runner.pyz        this package as one zipapp (put there by the server)
    HOME/agent.json, agent.pid, agent.lock, agent.log, agent.stop, retired
    HOME/jobs/<job_id>/spec.json      written by the server (through ``submit``); the job runner
                                      rewrites it without env values once it has read them
    HOME/jobs/<job_id>/spec.sha256    digest of the spec as submitted (tells a resubmit from a clash)
    HOME/jobs/<job_id>/status.json    written by the runner, always atomically
    HOME/jobs/<job_id>/output.log     the commands' stdout + stderr, appended as produced
    HOME/jobs/<job_id>/output.times   when the runner received each part of output.log
    HOME/jobs/<job_id>/runner.log     the job runner's own diagnostics
    HOME/jobs/<job_id>/mpi/hostfile
    HOME/jobs/<job_id>/workdir/       cwd of the commands
    HOME/jobs/<job_id>/stop           created by the server to request a stop
    HOME/jobs/<job_id>/probes.json    the readiness probes' results, written by the job runner
    HOME/jobs/<job_id>/container.env  a container job's env while ``docker create`` reads it (0600)

Every write a reader may race with is atomic (a temporary file, then a rename), so a reader sees
the old document or the new one, never a torn one.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

JOB_MARKER = "MUSTER_JOB_ID"


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
    # The thread too: the local backend calls this in a worker process that runs threads.
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    # 0600 whatever the umask: the local backend writes specs (secret values) from the server's
    # process, whose umask is not the runner's 077.
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
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
        self.times = os.path.join(self.dir, "output.times")  # when each part of it came (runner/log_times.py)
        self.runner_log = os.path.join(self.dir, "runner.log")
        self.runner_lock = os.path.join(self.dir, "runner.lock")
        self.mpi_dir = os.path.join(self.dir, "mpi")
        self.hostfile = os.path.join(self.mpi_dir, "hostfile")
        self.workdir = os.path.join(self.dir, "workdir")
        self.stop = os.path.join(self.dir, "stop")
        self.probes = os.path.join(self.dir, "probes.json")  # the readiness probes' last results
        self.home = os.path.dirname(os.path.abspath(jobs_dir))
        # In the environment of every process of the job (start_shell): how a stop finds them all.
        self.marker = (f"{JOB_MARKER}={job_id}", f"MUSTER_HOME={self.home}")


def check_job_id(job_id: str) -> None:
    # The id becomes a directory name; refuse anything that could escape HOME/jobs.
    if not job_id or job_id in (".", "..") or "/" in job_id or "\0" in job_id:
        raise ValueError(f"invalid job id: {job_id!r}")


def log_err(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    sys.stderr.write(f"{stamp} muster_runner[{os.getpid()}]: {message}\n")
    sys.stderr.flush()


def program() -> str:
    """The archive this package runs from (the zipapp, runner/shipping.py): agents and job runners
    are started from the same file, and their command lines name it (is_runner_process)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return here if os.path.isfile(here) else os.path.abspath(sys.argv[0])
