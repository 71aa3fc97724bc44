"""Container jobs: a spec with ``container.image`` runs as one Docker container named by the job.

The image is pulled unless present (images.py), the container is created with host networking, the
job's env and the MPI hostfile (read-only, at the same path), then started attached so its output
lands in output.log.  Stops use ``docker stop`` (SIGTERM, SIGKILL after the grace period) and every
end removes the container.  Every docker command puts ``--`` before its positional arguments, so an
image or name is never read as a flag.  ``container.policy`` is the fleet's (``allow_privileged``,
``allowed_prefixes``): a container that asks for more, with the host paths' symlinks resolved, is
refused (``policy_refusal``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import time
from typing import Any

from .cluster_env import base_env, cluster_env, job_script
from .files import JobPaths, write_json_atomic
from .images import DOCKER_CALL_TIMEOUT, DOCKER_MESSAGE_CAP, docker, pull_image
from .lifecycle import WATCH_INTERVAL, StopFlag, exit_fields, final_state, stop_grace
from .output_log import OutputLog, log_limit
from .probes import Prober, probe_address
from .usage import ContainerPids, Sampler

DEFAULT_PULL_TIMEOUT = 600.0
CONTAINER_WORKDIR = "/workflow"  # dstack's default working directory inside the container


def container_name(job_id: str) -> str:
    # Job ids are UUIDs when the server submits; anything Docker would refuse is hashed instead.
    if re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", job_id):
        return job_id
    return "muster-" + hashlib.sha256(job_id.encode()).hexdigest()[:24]


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
    # a pipe, not the file: the runner caps what output.log keeps (runner/output_log.py)
    attached = subprocess.Popen(
        ["docker", "start", "--attach", "--", name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=base_env(job.home), start_new_session=True, close_fds=True,
    )
    output_log = OutputLog(job.output, log_limit(spec), job.times).start(attached.stdout)
    started = time.monotonic()
    running = dict(base, state="running", pid=attached.pid, start_time=time.time())
    write_json_atomic(job.status, running)
    prober = Prober(job, spec.get("probes") or [], container=name, address=probe_address(spec)).start()
    sampler = Sampler(job, "", ContainerPids(name)).start()
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
    prober.stop()
    sampler.stop()
    try:
        attached.wait(DOCKER_CALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        attached.kill()
        attached.wait()
    output_log.finish()
    code, out = docker(["inspect", "--format", "{{.State.ExitCode}}|{{.State.Error}}", "--", name])
    status_text, _, error = out.partition("|")
    if code == 0 and error.strip() and reason is None:
        # The runtime could not start the process (caps, devices, a missing shell): not the commands' exit.
        return finish("failed", {"reason": "creating_container_error",
                                 "error": f"starting the container failed: {error.strip()}"})
    exit_status = int(status_text) if code == 0 and status_text.lstrip("-").isdigit() else attached.returncode
    return finish(final_state(exit_status, reason), dict(running, **exit_fields(exit_status)))
