"""Facts about the machine the server runs on, in the resources shape instances use."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess


def _memory_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return 0.0


def local_docker() -> dict | None:
    """{version, runtimes} of the Docker daemon this machine's `docker` reaches, else None."""
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
