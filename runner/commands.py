"""The verbs the server calls (protocol.COMMANDS): each prints one JSON document, except ``log``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from . import log_times
from .agent import heartbeat_fresh, job_cgroup, job_is_active, job_status, live_agent_pid, private_home
from .cgroups import kill_job_tree
from .cluster_env import as_int, base_env
from .containers import remove_container
from .files import Paths, create_exclusively, emit, program, read_json, touch
from .probes import probes_report
from .processes import is_runner_process
from .protocol import FINAL_STATES, validate_spec
from .usage import read_usage

ENSURE_AGENT_WAIT = 5.0


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
            [sys.executable, program(), "agent", "--home", paths.home],
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
    answer = submit_job(paths, job_id, sys.stdin.buffer.read())
    emit(answer)
    return 1 if "error" in answer else 0


def submit_job(paths: Paths, job_id: str, raw: bytes) -> dict[str, Any]:
    """What ``submit`` prints (the local backend calls it in-process); an answer with "error" is a
    refusal."""
    job = paths.job(job_id)
    try:
        spec = validate_spec(json.loads(raw.decode("utf-8")))
    except ValueError as e:
        return {"submitted": False, "error": f"bad spec: {e}"}
    os.makedirs(job.dir, mode=0o700, exist_ok=True)
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
            return {"submitted": False, "error": f"job {job_id} already exists with a different spec"}
        return {"submitted": False}
    return {"submitted": create_exclusively(job.spec, raw)}


def cmd_status(paths: Paths) -> int:
    emit(status_report(paths))
    return 0


def status_report(paths: Paths) -> dict[str, Any]:
    """What ``status`` prints; reads files and /proc only (the local backend calls it in-process)."""
    now = time.time()
    agent = read_json(paths.agent_json)
    pid = as_int(agent.get("pid")) if isinstance(agent, dict) else 0
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
                probes = probes_report(paths.job(job_id))
                if probes is not None:
                    status["probes"] = probes
                usage = read_usage(paths.job(job_id))
                if usage is not None:
                    status["usage"] = usage  # the last sample (runner/usage.py)
                jobs[job_id] = status
    return {"now": now, "agent": agent if isinstance(agent, dict) else None, "agent_alive": alive, "jobs": jobs}


def cmd_stop(paths: Paths, job_id: str) -> int:
    emit(stop_job(paths, job_id))
    return 0


def stop_job(paths: Paths, job_id: str) -> dict[str, Any]:
    job = paths.job(job_id)
    if not os.path.isdir(job.dir):
        return {"stopping": False, "error": "unknown job"}
    touch(job.stop)
    return {"stopping": True}


def cmd_log(paths: Paths, job_id: str, offset: int, limit: int, times: bool = False) -> int:
    out = sys.stdout.buffer
    if times:
        out.write(log_timed(paths, job_id, offset, limit))
    else:
        for chunk in log_chunks(paths, job_id, offset, limit):
            out.write(chunk)
    out.flush()
    return 0


def log_timed(paths: Paths, job_id: str, offset: int, limit: int) -> bytes:
    """The log's bytes from `offset` with their output.times records (runner/log_times.py: framed)."""
    data = b"".join(log_chunks(paths, job_id, offset, limit))
    return log_times.framed(data, log_times.records_between(paths.job(job_id).times, offset, offset + len(data)),
                            offset)


def log_chunks(paths: Paths, job_id: str, offset: int, limit: int):
    """The job's output from `offset`, at most `limit` bytes, 64 KiB at a time."""
    job = paths.job(job_id)
    try:
        f = open(job.output, "rb")
    except FileNotFoundError:
        return
    with f:
        f.seek(offset)
        remaining = limit
        while remaining > 0:
            chunk = f.read(min(remaining, 64 * 1024))
            if not chunk:
                break
            yield chunk
            remaining -= len(chunk)


def cmd_cleanup(paths: Paths, job_id: str) -> int:
    emit(cleanup_job(paths, job_id))
    return 0


def cleanup_job(paths: Paths, job_id: str) -> dict[str, Any]:
    job = paths.job(job_id)
    if not os.path.isdir(job.dir):
        return {"removed": False, "reason": "no such job"}
    status = job_status(job)
    if job_is_active(job, status):
        return {"removed": False, "reason": "job is " + str(status["state"])}
    # A runner that died, or one that finished while a daemon of its job still lingers: nothing of
    # the job may outlive its directory.
    status = status or {}
    # A finished job's group id may belong to someone else by now; its marker cannot.
    pgid = as_int(status.get("pgid")) if status.get("state") not in FINAL_STATES else 0
    kill_job_tree(job.marker, pgid, 0.5, cgroup=job_cgroup(status))
    if isinstance(status.get("container"), str):
        remove_container(status["container"])
    shutil.rmtree(job.dir, ignore_errors=True)
    return {"removed": True}
