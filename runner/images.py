"""Pulling a container job's image (state ``pulling``), with a throw-away client configuration for
its registry's credentials.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any

from .cluster_env import base_env
from .files import JobPaths, write_json_atomic
from .lifecycle import WATCH_INTERVAL, StopFlag

DOCKER_CALL_TIMEOUT = 60.0  # one docker CLI call other than the pull and the job itself
DOCKER_MESSAGE_CAP = 2000  # characters of Docker's output kept for an error message


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
