"""The agent (the ``agent`` verb): one long-lived process per runner home that starts submitted
jobs, notices runners that died, and writes a heartbeat.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from typing import Any

from .cgroups import kill_job_tree
from .cluster_env import as_int, base_env
from .containers import remove_container
from .files import JobPaths, Paths, log_err, program, read_json, write_json_atomic
from .lifecycle import StopFlag
from .processes import is_runner_process, pid_alive
from .protocol import FINAL_STATES, VERSION, validate_spec

HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_FRESH = 5.0
# A spec that fails to parse may still be in the middle of a non-atomic copy; only a spec that has
# stayed broken this long is declared failed.
SPEC_SETTLE_SECONDS = 2.0
# A job left in "starting" this long without a runner is considered abandoned (the agent died
# between writing the status and spawning the job runner).
STARTING_ABANDONED_AFTER = 60.0



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
                [sys.executable, program(), "job", "--home", self.paths.home, "--job", job.job_id],
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
                as_int(status.get("runner_pid")), "job", job_id
            ):
                self.fail_if_unfinished(job, "job runner died")
            elif status.get("state") == "starting" and not job_is_active(job, status):
                self.fail_if_unfinished(job, "job runner never started")

    def fail_if_unfinished(self, job: JobPaths, error: str) -> None:
        # Re-read: the runner writes its final status before exiting, so a fresh read decides.
        status = read_json(job.status)
        if not isinstance(status, dict) or status.get("state") in FINAL_STATES:
            return
        kill_job_tree(job.marker, as_int(status.get("pgid")), 0.5, cgroup=job_cgroup(status))
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


def read_agent_pid(paths: Paths) -> int:
    return as_int(read_json(paths.agent_pid))


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


def job_status(job: JobPaths) -> dict[str, Any] | None:
    status = read_json(job.status)
    if isinstance(status, dict):
        return status
    if os.path.exists(job.spec):
        return {"state": "submitted"}
    return None


def job_is_active(job: JobPaths, status: dict[str, Any] | None) -> bool:
    if status is None or status.get("state") in FINAL_STATES + ("submitted",):
        return False
    if status.get("state") == "starting":
        return time.time() - float(status.get("time") or 0) < STARTING_ABANDONED_AFTER
    return is_runner_process(as_int(status.get("runner_pid")), "job", job.job_id)


def job_cgroup(status: dict[str, Any]) -> str:
    cgroup = status.get("cgroup")
    # status.json is ours, but only a job cgroup we named is ever signalled or removed.
    return cgroup if isinstance(cgroup, str) and os.path.basename(cgroup).startswith("muster-") else ""
