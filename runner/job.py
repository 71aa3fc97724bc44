"""The job runner (the ``job`` verb): one process per job, which runs its commands and records
how they ended in its status.json.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from typing import Any

from .cgroups import create_job_cgroup, kill_job_tree, remove_cgroup
from .cluster_env import base_env, build_env, hostfile_content, job_script
from .containers import run_container_job
from .files import JobPaths, Paths, log_err, read_json, write_json_atomic
from .lifecycle import WATCH_INTERVAL, StopFlag, exit_fields, final_state, stop_grace
from .output_log import OutputLog, log_limit
from .probes import Prober, probe_address
from .processes import marked_pids
from .protocol import validate_spec
from .usage import Sampler


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


def start_shell(job: JobPaths, spec: dict[str, Any], cgroup: str) -> tuple[subprocess.Popen, OutputLog]:
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

    # a pipe, not the file: the runner caps what output.log keeps (runner/output_log.py)
    proc = subprocess.Popen(
        ["/bin/sh", "-c", job_script(spec["commands"])],
        preexec_fn=enter_cgroup if cgroup else None,
        cwd=job.workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own process group: a stop kills everything the job spawned
        close_fds=True,
    )
    return proc, OutputLog(job.output, log_limit(spec), job.times).start(proc.stdout)


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
        proc, output = start_shell(job, spec, cgroup)
    except (OSError, ValueError) as e:
        remove_cgroup(locals().get("cgroup", ""))
        write_json_atomic(
            job.status, dict(base, state="failed", error=f"cannot start: {e}", end_time=time.time())
        )
        return 1
    started = time.monotonic()
    running = dict(base, state="running", pid=proc.pid, pgid=proc.pid, cgroup=cgroup, start_time=time.time())
    write_json_atomic(job.status, running)
    prober = Prober(job, spec.get("probes") or [], address=probe_address(spec)).start()
    sampler = Sampler(job, cgroup, lambda: sorted(set(marked_pids(job.marker)) | {proc.pid})).start()
    try:
        reason = watch_job(job, proc, spec, started, flag, cgroup)
    finally:
        prober.stop()
        sampler.stop()
    # Background children (`server &`, daemons) outlive the shell; a finished job must not leak them.
    kill_job_tree(job.marker, proc.pid, stop_grace(spec), proc, cgroup)
    output.finish()  # all the job printed is in output.log before its status says it ended
    final = dict(running, state=final_state(proc.returncode, reason), end_time=time.time())
    final.update(exit_fields(proc.returncode))
    write_json_atomic(job.status, final)
    return 0
