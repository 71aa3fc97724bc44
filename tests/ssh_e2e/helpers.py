"""Shared pieces of the SSH fleet tests: the skip marks, fleet configurations, and host inspection."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.engine.helpers import Beat  # noqa: F401  (beat's sweep includes the SSH host checks)
from tests.sshhosts import SSHHost, SSHHostPool

L40S = ("L40S", 46068)  # what `nvidia-smi` on an L40S host reports: 46068 MiB

needs_netns = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs OpenSSH sshd"),
]


def fleet_configuration(pool: SSHHostPool, name: str = "pd", hosts: list[SSHHost] | None = None,
                        placement: str = "cluster", **ssh) -> dict:
    """A fleet configuration object as a client sends it: the key as content, hosts as address + port."""
    chosen = list(pool) if hosts is None else hosts
    return {
        "type": "fleet", "name": name, "placement": placement,
        "ssh_config": {
            "user": pool.user, "private_key": pool.private_key,
            "hosts": [{"hostname": h.address, "port": h.port} for h in chosen],
            **ssh,
        },
    }


def host_commands(host: SSHHost) -> list[str]:
    """Command lines of every process running on the host (in its network namespace)."""
    found = []
    for pid in host.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.append(cmdline.strip())
    return found


def runner_processes(host: SSHHost) -> list[str]:
    """Command lines of the muster_runner processes (agent or job runners) running on the host."""
    return [c for c in host_commands(host) if "muster_runner" in c]


def break_python(host: SSHHost) -> None:
    """Make `python3` fail on the host (first on its PATH), so the runner agent cannot start there."""
    script = host.bin_dir / "python3"
    script.write_text("#!/bin/sh\necho 'python3 is broken on this test host' >&2\nexit 1\n")
    script.chmod(0o755)


