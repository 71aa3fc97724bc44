"""Run configurations and log parsing shared by the TPU tests."""

from __future__ import annotations

import os
import re
import shutil

import pytest
import yaml

from tests.conftest import example

ZONES = ["us-central1-a", "us-central1-b"]  # the zones of examples/tpu-fleet.yml

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or not os.path.exists("/usr/sbin/sshd"),
    reason="needs root, iproute2 and OpenSSH sshd (TPU hosts are sshd in network namespaces)",
)

PRINT_ENV = (
    'echo "rank=$DSTACK_NODE_RANK worker=$TPU_WORKER_ID ip=$DSTACK_NODE_IP '
    'nodes=$DSTACK_NODES_NUM hostnames=$TPU_WORKER_HOSTNAMES"'
)


def tpu_task(name: str, slice_name: str = "tpu-v2-32", **changes) -> dict:
    """examples/tpu-v2-32.yml, renamed, on another slice if asked, printing its cluster environment."""
    conf = yaml.safe_load(example("tpu-v2-32.yml"))
    return {**conf, "name": name, "commands": [*conf["commands"], PRINT_ENV],
            "resources": {"gpu": slice_name}, **changes}


def env_line(text: str) -> dict[str, str]:
    """The variables PRINT_ENV printed, from one job's log."""
    [line] = [ln for ln in text.splitlines() if ln.startswith("rank=")]
    return dict(re.findall(r"(\w+)=(\S*)", line))
