"""The fallback for machines without network namespaces: sshd on loopback addresses and high ports."""

from __future__ import annotations

import os

import pytest

from backends.ssh.commands import run
from backends.ssh.connection import connect
from backends.ssh.probe import probe
from tests.sshhosts import SSHHostPool
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs OpenSSH sshd")


def test_loopback_hosts_have_own_addresses_homes_and_gpus():
    with SSHHostPool(2, gpus=[[("L40S", 46068)], []], mode="loopback") as pool:
        assert pool.mode == "loopback"
        assert len({(h.address, h.port) for h in pool}) == 2
        assert all(h.address.startswith("127.") and h.port > 1024 for h in pool)
        gpu_counts = []
        for host in pool:
            c = connect(host.target())
            try:
                assert run(c, 'echo "$MUSTER_HOME"')[1].decode().strip() == str(host.muster_home)
                gpu_counts.append(len(probe(c)["gpus"]))
            finally:
                c.close()
        assert gpu_counts == [1, 0]
        root = pool.root
    assert not root.exists()


def test_loopback_kill_processes_finds_what_sessions_started():
    with SSHHostPool(1, mode="loopback") as pool:
        host = pool[0]
        c = connect(host.target())
        run(c, "setsid sleep 300 >/dev/null 2>&1 </dev/null &")
        c.close()
        # the shell returns before the detached sleep is surely in place: poll, never assume an instant
        wait_until(lambda: any(b"sleep 300" in _cmdline(p) for p in host.pids()), timeout=20, what="the sleep")
        sleepers = [p for p in host.pids() if p != host.sshd_pid]
        host.kill_processes(keep_sshd=True)
        assert all(not os.path.exists(f"/proc/{p}") or _zombie(p) for p in sleepers)


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ")
    except OSError:
        return b""
