"""The environment a job starts with (docs/how-it-works.md, "The cluster environment").
"""

from __future__ import annotations

import os
import pwd
from typing import Any

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def as_int(value: Any, default: int = 0) -> int:
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
    own = as_int(spec.get("gpus"))
    return [as_int(per_node[i]) if i < len(per_node) else own for i in range(len(ips))]


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
        return sum(as_int(g) for g in per_node)
    return as_int(spec.get("nodes_num"), 1) * as_int(spec.get("gpus"))


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def cluster_env(spec: dict[str, Any], hostfile_path: str) -> dict[str, str]:
    """The variables the runner sets for the job, before the user's env is applied."""
    info = cluster_info(spec)
    env = {
        "DSTACK_NODE_RANK": _text(spec.get("node_rank", spec.get("job_num", 0))),
        "DSTACK_NODES_NUM": _text(spec.get("nodes_num", 1)),
        "DSTACK_NODES_IPS": "\n".join(_text(ip) for ip in info.get("job_ips") or []),
        "DSTACK_MASTER_NODE_IP": _text(info.get("master_job_ip")),
        "DSTACK_GPUS_PER_NODE": _text(as_int(spec.get("gpus"))),
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
        if tpu.get("num_slices"):  # a multislice set: what JAX and libtpu read to join the slices
            env["MEGASCALE_NUM_SLICES"] = _text(tpu["num_slices"])
            env["MEGASCALE_SLICE_ID"] = _text(tpu.get("slice_id", 0))
            env["MEGASCALE_COORDINATOR_ADDRESS"] = _text(tpu.get("coordinator_address"))
            env["MEGASCALE_PORT"] = _text(tpu.get("megascale_port"))
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
