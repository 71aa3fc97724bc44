"""Facts about the machine the server runs on, in the resources shape instances use."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time


def _memory_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return 0.0


_DOCKER_SEEN: dict[tuple, tuple[float, dict | None]] = {}
DOCKER_SEEN_FOR = 10.0  # seconds an answer is reused: plans of image runs come in bursts


def local_docker() -> dict | None:
    """{version, runtimes} of the Docker daemon this machine's `docker` reaches, else None.

    Asked at every plan and submit of an image run that a local fleet could take (in the web
    request), so an answer is kept for DOCKER_SEEN_FOR seconds per daemon address: a burst of
    plans costs one `docker info`, and a hung daemon holds up one request, not each of them."""
    key = (os.environ.get("DOCKER_HOST"), os.environ.get("DOCKER_CONTEXT"))
    seen = _DOCKER_SEEN.get(key)
    now = time.monotonic()
    if seen is not None and now - seen[0] < DOCKER_SEEN_FOR:
        return seen[1]
    found = _ask_docker()
    _DOCKER_SEEN[key] = (now, found)
    return found


def _ask_docker() -> dict | None:
    if shutil.which("docker") is None:
        return None
    try:
        out = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}|{{range $k, $v := .Runtimes}}{{$k}},{{end}}"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    version, _, runtimes = out.stdout.strip()[:2000].partition("|")
    if out.returncode != 0 or not version:
        return None
    return {"version": version[:64], "runtimes": sorted({r for r in runtimes.split(",") if r})[:16]}


def local_resources(path: str = "/") -> dict:
    machine = platform.machine().lower()
    return {
        "cpus": os.cpu_count() or 1,
        "memory_gb": _memory_gb(),
        "disk_gb": round(shutil.disk_usage(path).total / 1e9, 1),
        "cpu_arch": "arm" if machine in ("arm64", "aarch64") else "x86",
        "gpus": [],
        "tpu": None,
        "docker": local_docker(),  # jobs with `image` run in containers where this is set
    }
