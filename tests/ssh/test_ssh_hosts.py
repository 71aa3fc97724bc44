"""Real sshd test hosts in network namespaces, and the paramiko transport and probe against them."""

from __future__ import annotations

import ipaddress
import os
import platform
import shutil
import socket
import subprocess
import threading
import time

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from backends.ssh.commands import put_file, run
from backends.ssh.connection import connect, remote_host_key
from backends.ssh.errors import (
    AuthenticationFailed,
    HostKeyMismatch,
    HostUnreachable,
    InvalidPrivateKey,
    OutputTooLarge,
    SSHCommandTimeout,
)
from backends.ssh.probe import probe
from tests.sshhosts import SSHHostPool, ssh_hosts  # noqa: F401 - fixture
from tests.waiting import wait_until

L40S = ("L40S", 46068)
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
)
needs_sshd = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs OpenSSH sshd")
pytestmark = [pytest.mark.netns, needs_root, needs_sshd]


@pytest.fixture(scope="module")
def pool():
    with SSHHostPool(3, gpus=[[L40S, L40S]], mode="netns") as pool:
        yield pool


@pytest.fixture
def client(pool):
    c = connect(pool[0].target())
    yield c
    c.close()


def _netns_names() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def _links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def test_each_host_answers_ssh_at_its_own_address(pool):
    assert pool.mode == "netns"
    addresses = [h.address for h in pool]
    assert len(set(addresses)) == 3
    for host in pool:
        assert ipaddress.IPv4Address(host.address) in pool.network
        assert host.address.startswith("10.") and host.port == 22 and host.user == "root"
        c = connect(host.target())
        try:
            status, out, _ = run(c, "ip -o -4 addr show scope global")
        finally:
            c.close()
        assert status == 0
        # The session runs inside the host's namespace: it has that address and no other.
        assert f"inet {host.address}/24" in out.decode()
        assert all(f"inet {other}/" not in out.decode() for other in addresses if other != host.address)


def test_session_environment_puts_host_bin_first_and_sets_runner_home(pool, client):
    host = pool[0]
    status, out, _ = run(
        client, 'echo "$PATH"; echo "$MUSTER_HOME"; command -v nvidia-smi; command -v python3'
    )
    path, muster_home, nvidia_smi, python3 = out.decode().splitlines()
    assert path.split(":")[0] == str(host.bin_dir)
    assert muster_home == str(host.muster_home)
    assert nvidia_smi == str(host.bin_dir / "nvidia-smi")
    assert python3.startswith("/usr/")  # the machine's dotfiles (pyenv shims etc.) stay out


def test_hosts_reach_each_other_and_the_server_over_the_bridge(pool):
    check = "import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); print(s.recv(64))"
    for src, dst in ((pool[1], pool[2]), (pool[2], pool[0])):
        proc = src.netns_exec(["python3", "-c", check, dst.address, "22"], timeout=15)
        assert proc.returncode == 0, proc.stderr
        assert "SSH-2.0" in proc.stdout
    # A service of the server (root namespace, bridge address) is reachable from a host.
    with socket.create_server((pool.bridge_address, 0)) as server:
        port = server.getsockname()[1]

        def greet() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"hello from the server")

        t = threading.Thread(target=greet, daemon=True)
        t.start()
        proc = pool[1].netns_exec(["python3", "-c", check, pool.bridge_address, str(port)], timeout=15)
        t.join(5)
    assert "hello from the server" in proc.stdout, proc.stderr


def test_probe_reports_two_l40s_on_the_gpu_host(pool, client):
    resources = probe(client)
    assert resources["gpus"] == [{"name": "L40S", "memory_gb": 45.0, "vendor": "nvidia"}] * 2
    assert resources["internal_ip"] == pool[0].address
    assert resources["network"] == str(pool.network)


def test_probe_reports_cpu_host_size_and_no_gpus(pool):
    c = connect(pool[1].target())
    try:
        resources = probe(c)
    finally:
        c.close()
    meminfo_kb = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal:")))
    assert resources["gpus"] == []
    assert resources["tpu_chips"] == 0 and resources["tpu"] is None
    assert resources["cpus"] == len(os.sched_getaffinity(0))
    assert resources["memory_gb"] == round(meminfo_kb / 1024 / 1024, 1)
    assert abs(resources["disk_gb"] - shutil.disk_usage("/").total / 2**30) < 1
    assert resources["cpu_arch"] == {"x86_64": "x86", "aarch64": "arm"}[platform.machine()]
    assert resources["internal_ip"] == pool[1].address
    assert resources["network"] == str(pool.network)
    assert resources["python3"].endswith("python3")


def test_fake_nvidia_smi_prints_what_the_real_one_prints(pool, client):
    _, units, _ = run(client, "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader")
    _, nounits, _ = run(client, "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits")
    _, header, _ = run(client, "nvidia-smi --query-gpu=index,name,memory.total --format=csv")
    assert units == b"NVIDIA L40S, 46068 MiB\nNVIDIA L40S, 46068 MiB\n"
    assert nounits == b"NVIDIA L40S, 46068\nNVIDIA L40S, 46068\n"
    assert header.decode().splitlines() == [
        "index, name, memory.total [MiB]",
        "0, NVIDIA L40S, 46068 MiB",
        "1, NVIDIA L40S, 46068 MiB",
    ]


def test_set_gpus_changes_what_the_probe_sees(pool):
    host = pool[2]
    host.set_gpus([("H100 80GB HBM3", 81559)])
    try:
        c = connect(host.target())
        try:
            assert probe(c)["gpus"] == [{"name": "H100 80GB HBM3", "memory_gb": 79.6, "vendor": "nvidia"}]
        finally:
            c.close()
    finally:
        host.set_gpus([])


def test_run_separates_streams_passes_stdin_and_exit_status(client):
    status, out, err = run(client, "cat; echo to-err >&2; exit 3", stdin=b"from stdin")
    assert (status, out, err) == (3, b"from stdin", b"to-err\n")


def test_run_drains_large_output_before_the_exit_status(client):
    status, out, _ = run(client, "head -c 8000000 /dev/zero", timeout=30, max_output=8_000_000)
    assert status == 0 and len(out) == 8_000_000


def test_run_stops_a_command_that_prints_past_the_output_limit(client):
    with pytest.raises(OutputTooLarge, match="printed more than 1048576 bytes"):
        run(client, "yes; echo never", timeout=30, max_output=1 << 20)
    assert run(client, "echo still usable")[1] == b"still usable\n", "the connection survives"


def test_run_raises_timeout_for_a_slow_command(client):
    started = time.monotonic()
    with pytest.raises(SSHCommandTimeout, match="did not finish within 1 s"):
        run(client, "sleep 30", timeout=1)
    assert time.monotonic() - started < 5
    assert run(client, "echo still usable")[1] == b"still usable\n"


def test_put_file_writes_bytes_with_mode(pool, client):
    remote = str(pool[0].home / "uploaded.sh")
    put_file(client, b"#!/bin/sh\necho uploaded\n", remote, mode=0o750)
    assert run(client, f"stat -c %a {remote}; {remote}")[1] == b"750\nuploaded\n"


def test_wrong_port_is_unreachable_and_names_host_and_port(pool):
    with pytest.raises(HostUnreachable, match=rf"cannot reach {pool[0].address}:2222"):
        connect(pool[0].target(port=2222), timeout=3)


def test_silent_address_is_unreachable_after_the_timeout(pool):
    silent = str(list(pool.network.hosts())[200])
    with pytest.raises(HostUnreachable, match=f"cannot reach {silent}:22"):
        connect(pool[0].target(hostname=silent, host_key=""), timeout=1)


def test_key_not_authorized_is_authentication_failure(pool):
    stranger = (
        Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        .decode()
    )
    with pytest.raises(AuthenticationFailed, match="authorized_keys"):
        connect(pool[0].target(private_key=stranger))


def test_unknown_user_is_authentication_failure(pool):
    with pytest.raises(AuthenticationFailed, match="nosuchuser"):
        connect(pool[0].target(username="nosuchuser"))


def test_changed_host_key_is_refused(pool):
    # host1's key recorded for host0: what a reinstalled host or an impostor looks like.
    with pytest.raises(HostKeyMismatch) as raised:
        connect(pool[0].target(host_key=pool[1].host_key))
    assert pool[0].host_key_fingerprint in str(raised.value) and pool[1].host_key_fingerprint in str(raised.value)


def test_first_contact_accepts_and_reports_the_host_key(pool):
    c = connect(pool[2].target(host_key=""))
    try:
        assert remote_host_key(c) == pool[2].host_key
    finally:
        c.close()


@pytest.mark.parametrize("kind", ["rsa", "ecdsa"])
def test_rsa_and_ecdsa_client_keys_authenticate(pool, kind):
    key = rsa.generate_private_key(65537, 2048) if kind == "rsa" else ec.generate_private_key(ec.SECP256R1())
    text = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    with open(pool.authorized_keys, "ab") as f:
        f.write(public + b"\n")
    c = connect(pool[1].target(private_key=text))
    try:
        assert run(c, "echo ok")[1] == b"ok\n"
    finally:
        c.close()


def test_garbage_private_key_is_reported_as_such(pool):
    with pytest.raises(InvalidPrivateKey):
        connect(pool[0].target(private_key="not a key"))


def test_stopped_sshd_is_unreachable_until_started_again(pool):
    host = pool[2]
    host.stop_sshd()
    try:
        with pytest.raises(HostUnreachable, match="cannot reach"):
            connect(host.target(), timeout=3)
    finally:
        host.start_sshd()
    c = connect(host.target())
    assert run(c, "echo back")[1] == b"back\n"
    c.close()


def test_kill_processes_can_keep_sshd(pool):
    host = pool[1]
    c = connect(host.target())
    run(c, "setsid sleep 300 >/dev/null 2>&1 </dev/null &")
    c.close()
    # the shell returns before the detached sleep is surely in place: poll, never assume an instant
    wait_until(lambda: any("sleep 300" in _cmdline(p) for p in host.pids()), timeout=20, what="the sleep on the host")
    host.kill_processes(keep_sshd=True)
    wait_until(lambda: all("sleep" not in _cmdline(p) for p in host.pids()), timeout=20, what="the sleep killed")
    c = connect(host.target())
    assert run(c, "echo alive")[1] == b"alive\n"
    c.close()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_teardown_removes_namespaces_bridge_processes_and_files_even_after_a_failure():
    with pytest.raises(RuntimeError, match="test failed"):
        with SSHHostPool(2, mode="netns") as doomed:
            namespaces = [h.netns for h in doomed]
            bridge, root = doomed.bridge, doomed.root
            sleeper = doomed[0].netns_popen(["sleep", "300"])
            assert all(ns in _netns_names() for ns in namespaces)
            raise RuntimeError("test failed")
    assert sleeper.wait(5) is not None
    names = _netns_names()
    assert all(ns not in names for ns in namespaces)
    assert f" {bridge}:" not in _links() and f"{doomed.tag}v0" not in _links()
    assert not root.exists()


def test_leftovers_of_a_dead_test_run_are_removed_by_the_next_pool():
    dead_pid = 0x400001  # above the largest pid_max Linux allows, so never a live process
    assert not os.path.exists(f"/proc/{dead_pid}")
    ns, bridge = f"mu{dead_pid:x}s0-h0", f"mu{dead_pid:x}s0br"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    try:
        with SSHHostPool(1, mode="netns"):
            assert ns not in _netns_names()
            assert f" {bridge}:" not in _links()
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def test_ssh_hosts_fixture_makes_pools_with_per_host_gpus(ssh_hosts):  # noqa: F811 - the fixture
    pool = ssh_hosts(2, gpus=[[], [L40S]])
    counts = []
    for host in pool:
        c = connect(host.target())
        try:
            counts.append(len(probe(c)["gpus"]))
        finally:
            c.close()
    assert counts == [0, 1]


def test_missing_private_key_is_an_authentication_problem(pool):
    with pytest.raises(AuthenticationFailed, match="no SSH private key"):
        connect(pool[0].target(private_key=""))
