"""Real SSH test hosts.

A test host is a real OpenSSH `sshd` that Muster reaches exactly as it reaches a machine in an SSH
fleet: by address, port, user and private key. As root, each host lives in its own network
namespace with its own 10.x address on a Linux bridge, so processes started on it bind to that
address, see it in `ip addr`/`hostname -I`, and reach the other hosts and the server (the bridge
address, in the root namespace) over a real network. All hosts share the machine's filesystem, so
each has its own directory: sessions get `MUSTER_HOME=<home>/muster` (separate runner homes) and
`<home>/bin` first on PATH (where `set_gpus` puts an `nvidia-smi` that prints what a real one
prints for the GPUs given, which makes the host a GPU host to the probe).

Where network namespaces are unavailable (not root, or `ip netns add` fails), the pool falls back to
one sshd per host on its own loopback address 127.x.y.k and a free high port (`pool.mode ==
"loopback"`); everything above still holds except the network isolation. Set
MUSTER_SSH_HOSTS_MODE=loopback to force the fallback.

How the session environment is set: sshd_config `SetEnv` is applied by sshd after its own defaults,
so `SetEnv PATH=...` does reach exec sessions. But the command then runs under the user's login
shell, and bash started by sshd sources ~/.bashrc even when non-interactive; root's commonly
prepends to PATH (pyenv shims, cargo). So SetEnv also sets HOME=<home>: bash then reads the
host's own (absent) dotfiles. The session's working directory is still the user's home from
/etc/passwd; paths the tests use are absolute. tests/ssh/test_ssh_hosts.py checks the result.

Caveat: where br_netfilter is loaded and iptables' FORWARD policy is DROP (a Docker host),
host-to-host traffic over the bridge is dropped; host-to-server traffic is not affected.

Docker (`SSHHostPool(n, docker=True)`, netns mode only): each host runs its own dockerd, started
with `nsenter --net` into the host's namespace (`ip netns exec` would remount /sys and hide the
cgroups from it), without iptables or a bridge (containers use `--network host`), with its own data
root, exec root and socket under the host's directory; sshd hands the socket to every session as
DOCKER_HOST. Teardown removes the containers while the daemon answers, then the daemon, then what
it left (shims by command line, overlay mounts). See shared/reference/docker-in-netns.md.

Use in tests: the `ssh_hosts` fixture yields `make(n, gpus=None)`; or `with SSHHostPool(3) as pool:`.
"""

from __future__ import annotations

import atexit
import getpass
import hashlib
import ipaddress
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.sshhost_docker import HostDocker
from tests.sshhost_netns import _free_subnet, _remove_stale_networks
from tests.sshhost_tools import (  # noqa: F401 - _run and _ed25519_keypair are imported from here by tests
    _NVIDIA_SMI,
    _ed25519_keypair,
    _fingerprint,
    _run,
    _wait_for_ssh_banner,
    _write,
)

SSHD = "/usr/sbin/sshd"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GPU = tuple[str, int]  # (name as a user writes it, e.g. "L40S"; memory in MiB)

_pool_numbers = itertools.count()


class SSHHost(HostDocker):
    """One test host: a running sshd plus the directory that stands for its disk."""

    def __init__(self, pool: SSHHostPool, index: int, address: str, port: int, netns: str | None):
        self.pool = pool
        self.index = index
        self.name = f"host{index}"
        self.address = address
        self.port = port
        self.user = pool.user
        self.netns = netns
        self.home = pool.root / self.name
        self.bin_dir = self.home / "bin"
        self.muster_home = self.home / "muster"
        self._ssh_dir = self.home / "ssh"
        self._sshd: subprocess.Popen[bytes] | None = None
        self.docker_dir = self.home / "docker"
        self.docker_sock: Path | None = None  # set while the host runs its own dockerd
        self._docker_announced = False  # sessions get DOCKER_HOST even before the dockerd runs
        for d in (self.bin_dir, self._ssh_dir):
            d.mkdir(parents=True, exist_ok=True)
        host_private, self.host_public_key = _ed25519_keypair()
        _write(self._ssh_dir / "host_ed25519", host_private, 0o600)
        _write(self._ssh_dir / "host_ed25519.pub", self.host_public_key + "\n", 0o644)
        self.host_key_fingerprint = _fingerprint(self.host_public_key)
        self._config = self._ssh_dir / "sshd_config"
        self._log = self._ssh_dir / "sshd.log"
        self._write_config()

    # The client key is the pool's: every host authorizes it.
    @property
    def private_key(self) -> str:
        return self.pool.private_key

    @property
    def private_key_path(self) -> Path:
        return self.pool.private_key_path

    @property
    def host_key(self) -> str:
        """The host's public key as "<keytype> <base64>" (what SSHTarget.host_key records)."""
        return " ".join(self.host_public_key.split()[:2])

    @property
    def session_env(self) -> dict[str, str]:
        # HOME too: bash, as the login shell of an sshd session, sources ~/.bashrc, and root's
        # commonly rewrites PATH (pyenv, cargo); a per-host HOME keeps the machine's dotfiles out.
        env = {
            "HOME": str(self.home),
            "MUSTER_HOME": str(self.muster_home),
            "PATH": f"{self.bin_dir}:{BASE_PATH}",
        }
        if self.docker_sock is not None or self._docker_announced:
            env["DOCKER_HOST"] = f"unix://{self.docker_dir / 'docker.sock'}"
        return env

    def __repr__(self) -> str:
        return f"<SSHHost {self.name} {self.user}@{self.address}:{self.port} ({self.pool.mode})>"

    def target(self, **overrides: Any):
        """An SSHTarget for this host (host key pinned); keyword arguments override fields."""
        from backends.ssh.connection import SSHTarget

        fields = {
            "hostname": self.address,
            "port": self.port,
            "username": self.user,
            "private_key": self.private_key,
            "host_key": self.host_key,
        }
        fields.update(overrides)
        return SSHTarget(**fields)

    def reconfigure_sshd(self, sftp: bool = True, extra: Sequence[str] = (), max_startups: str | None = None) -> None:
        """Restart sshd with the sftp subsystem on or off, `extra` sshd_config lines (ForceCommand, ...)
        and `max_startups` (sshd's MaxStartups, e.g. "3:100:3"; a setting sshd takes from its first line)."""
        self._sftp, self._extra_config, self._max_startups = sftp, list(extra), max_startups
        self._write_config()
        self.stop_sshd()
        self.start_sshd()

    def _write_config(self) -> None:
        listen = "0.0.0.0" if self.netns else self.address
        env = " ".join(f"{k}={v}" for k, v in self.session_env.items())
        lines = [
            f"Port {self.port}",
            f"ListenAddress {listen}",
            f"HostKey {self._ssh_dir / 'host_ed25519'}",
            f"PidFile {self._ssh_dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.pool.authorized_keys}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            *(["Subsystem sftp internal-sftp"] if getattr(self, "_sftp", True) else []),
            f"SetEnv {env}",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            # Tests open many connections at once (one per SSHRunnerHost, parallel probes).
            f"MaxStartups {getattr(self, '_max_startups', None) or '200:30:400'}",
            "MaxSessions 100",
            "LogLevel INFO",
            *getattr(self, "_extra_config", []),
        ]
        _write(self._config, "\n".join(lines) + "\n", 0o644)

    # --- sshd -------------------------------------------------------------------------------------

    def start_sshd(self) -> None:
        if self._sshd is not None and self._sshd.poll() is None:
            return
        cmd = [SSHD, "-D", "-e", "-f", str(self._config)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        with open(self._log, "ab") as log:
            # A new session: a Ctrl-C aimed at pytest must not take the hosts down mid-teardown.
            self._sshd = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        _wait_for_ssh_banner(self.address, self.port, self._sshd, self._log)

    def stop_sshd(self) -> None:
        """Stop the listening sshd (new connections are refused); sessions already open stay."""
        proc, self._sshd = self._sshd, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    @property
    def sshd_log(self) -> str:
        """What sshd has logged (LogLevel INFO: one "Accepted publickey" line per login)."""
        return self._log.read_text(errors="replace") if self._log.exists() else ""

    @property
    def sshd_running(self) -> bool:
        return self._sshd is not None and self._sshd.poll() is None

    @property
    def sshd_pid(self) -> int | None:
        """The listening sshd's pid while it runs."""
        return self._sshd.pid if self.sshd_running and self._sshd else None

    # --- GPUs -------------------------------------------------------------------------------------

    def set_gpus(self, gpus: Sequence[GPU]) -> None:
        """Make the host report these GPUs through `nvidia-smi`; an empty list removes the tool."""
        script = self.bin_dir / "nvidia-smi"
        if not gpus:
            script.unlink(missing_ok=True)
            return
        rows = []
        for i, (name, mib) in enumerate(gpus):
            full = name if name.startswith("NVIDIA ") else f"NVIDIA {name}"
            if "|" in full or "'" in full or "\n" in full:
                raise ValueError(f"GPU name {name!r} cannot be represented")
            uuid = (
                f"GPU-{hashlib.sha1(f'{self.home}/{i}'.encode()).hexdigest()[:8]}-0000-0000-0000-000000000000"
            )
            rows.append(f"{i}|{full}|{int(mib)}|{uuid}")
        _write(script, _NVIDIA_SMI.replace("@GPUS@", "\n".join(rows)), 0o755)

    # --- processes in the host --------------------------------------------------------------------

    def _wrap(self, cmd: str | Sequence[str]) -> list[str]:
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        env = [f"{k}={v}" for k, v in self.session_env.items()]
        full = ["env", *env, *argv]
        return ["ip", "netns", "exec", self.netns, *full] if self.netns else full

    def netns_exec(
        self, cmd: str | Sequence[str], timeout: float = 30, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run a command on the host (inside its namespace) with the session environment."""
        return subprocess.run(self._wrap(cmd), capture_output=True, text=True, timeout=timeout, check=check)

    def netns_popen(self, cmd: str | Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start a long-running command on the host; kill_processes() or teardown stops it."""
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self._wrap(cmd), **kwargs)

    def pids(self) -> list[int]:
        """Processes running on the host.

        netns: everything in the namespace. loopback: the sshd listener plus every process whose
        environment carries this host's MUSTER_HOME (sessions and what they started).
        """
        if self.netns:
            out = _run(["ip", "netns", "pids", self.netns], check=False).stdout
            return [int(p) for p in out.split()]
        marker = f"MUSTER_HOME={self.muster_home}".encode()
        found = [self._sshd.pid] if self.sshd_running and self._sshd else []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def kill_processes(self, keep_sshd: bool = False) -> None:
        """SIGKILL everything running on the host (sshd too unless keep_sshd)."""
        keep = self._sshd.pid if keep_sshd and self._sshd is not None else None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = [p for p in self.pids() if p != keep]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        if not keep_sshd and self._sshd is not None:
            self._sshd.wait(5)
            self._sshd = None


class SSHHostPool:
    """N test hosts (see the module docstring); a context manager that removes everything on exit."""

    def __init__(
        self, n: int = 1, gpus: Sequence[GPU] | Sequence[Sequence[GPU]] | None = None, mode: str | None = None,
        docker: bool = False, insecure_registries: Sequence[str] = (),
    ):
        self.n = n
        self.docker = docker
        self.insecure_registries = list(insecure_registries)
        self.number = next(_pool_numbers)
        self.tag = f"mu{os.getpid():x}s{self.number}"  # also names the bridge and veths (15-char limit)
        self.mode = mode or os.environ.get("MUSTER_SSH_HOSTS_MODE") or ""
        self.user = getpass.getuser()
        self.hosts: list[SSHHost] = []
        self.bridge = ""
        self.bridge_address = ""
        self.network: ipaddress.IPv4Network | None = None
        self._namespaces: list[str] = []
        self._closed = False
        self._gpus = gpus
        self.root = Path(tempfile.mkdtemp(prefix=f"muster-ssh-{self.tag}-"))
        self.private_key, self.public_key = _ed25519_keypair()
        self.private_key_path = self.root / "client_ed25519"
        _write(self.private_key_path, self.private_key, 0o600)
        self.authorized_keys = self.root / "authorized_keys"
        _write(self.authorized_keys, self.public_key + " muster-tests\n", 0o644)

    def __enter__(self) -> SSHHostPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, index: int) -> SSHHost:
        return self.hosts[index]

    def __iter__(self) -> Iterator[SSHHost]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def start(self) -> None:
        atexit.register(self.close)
        try:
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
        except OSError:
            pass
        try:
            if self.mode != "loopback":
                try:
                    self._start_netns()
                    self.mode = "netns"
                except (RuntimeError, OSError) as exc:
                    if self.mode == "netns":
                        raise
                    self._remove_network()
                    print(
                        f"\n[sshhosts] network namespaces unavailable ({exc}); "
                        "test SSH hosts fall back to sshd on loopback addresses and high ports",
                        file=sys.stderr,
                    )
                    self.mode = "loopback"
            if self.mode == "loopback":
                self._start_loopback()
            if self.docker and self.mode != "netns":
                raise RuntimeError("Docker on test hosts needs netns mode")
            for host, gpus in zip(self.hosts, self._gpus_per_host(), strict=True):
                host.set_gpus(gpus)
                if self.docker:
                    # the tests' open registry listens there over plain HTTP (one with auth uses TLS)
                    host.start_dockerd([*self.insecure_registries, f"{self.bridge_address}:5000"])
                host.start_sshd()
        except BaseException:
            self.close()
            raise

    def _gpus_per_host(self) -> list[Sequence[GPU]]:
        gpus = list(self._gpus or [])
        if gpus and isinstance(gpus[0], tuple):  # one list for every host
            return [gpus] * self.n  # type: ignore[list-item]
        return [list(g) for g in gpus[: self.n]] + [[]] * (self.n - len(gpus))  # type: ignore[arg-type]

    # --- netns ------------------------------------------------------------------------------------

    def _start_netns(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("not root")
        if shutil.which("ip") is None:
            raise RuntimeError("the ip command (iproute2) is missing")
        _remove_stale_networks()
        self.network = _free_subnet(self.number)
        addresses = list(self.network.hosts())
        self.bridge = f"{self.tag}br"
        self.bridge_address = str(addresses[0])
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.bridge_address}/{self.network.prefixlen}", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for k in range(self.n):
            ns, veth, peer = f"{self.tag}-h{k}", f"{self.tag}v{k}", f"{self.tag}p{k}"
            address = str(addresses[k + 1])
            _run(["ip", "netns", "add", ns])
            self._namespaces.append(ns)
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
            _run(["ip", "link", "set", peer, "netns", ns])
            _run(["ip", "link", "set", veth, "master", self.bridge, "up"])
            for args in (
                ["link", "set", "lo", "up"],
                ["link", "set", peer, "name", "eth0"],
                ["addr", "add", f"{address}/{self.network.prefixlen}", "dev", "eth0"],
                ["link", "set", "eth0", "up"],
                ["route", "add", "default", "via", self.bridge_address],
            ):
                _run(["ip", "-n", ns, *args])
            self.hosts.append(SSHHost(self, k, address, 22, ns))

    def _remove_network(self) -> None:
        for ns in self._namespaces:
            _run(["ip", "netns", "del", ns], check=False)
        self._namespaces = []
        for k in range(self.n):
            _run(["ip", "link", "del", f"{self.tag}v{k}"], check=False)  # normally gone with the namespace
        if self.bridge:
            _run(["ip", "link", "del", self.bridge], check=False)
        self.bridge = ""
        self.hosts = []

    # --- loopback ---------------------------------------------------------------------------------

    def _start_loopback(self) -> None:
        # 127.0.0.0/8 is all loopback on Linux; a per-pool /24 keeps concurrent runs apart.
        seed = (os.getpid() * 31 + self.number) % (250 * 250)
        base = f"127.{1 + seed // 250}.{1 + seed % 250}"
        for k in range(self.n):
            address = f"{base}.{k + 2}"
            with socket.socket() as sock:
                sock.bind((address, 0))
                port = sock.getsockname()[1]
            self.hosts.append(SSHHost(self, k, address, port, None))

    # --- teardown ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for host in self.hosts:
            try:
                host.stop_dockerd()
            except Exception as exc:  # keep tearing down the rest
                print(f"[sshhosts] could not stop dockerd of {host}: {exc}", file=sys.stderr)
            try:
                host.kill_processes()
            except Exception as exc:  # keep tearing down the rest
                print(f"[sshhosts] could not stop processes of {host}: {exc}", file=sys.stderr)
            host.stop_sshd()
        self._remove_network()
        shutil.rmtree(self.root, ignore_errors=True)


# --- pytest fixtures (registered in tests/conftest.py) ----------------------------------------------

HostFactory = Callable[..., SSHHostPool]


def _factory() -> tuple[HostFactory, list[SSHHostPool]]:
    pools: list[SSHHostPool] = []

    def make(
        n: int = 1, gpus: Sequence[GPU] | Sequence[Sequence[GPU]] | None = None, mode: str | None = None
    ) -> SSHHostPool:
        """n hosts; `gpus` is one GPU list for every host, or a list of GPU lists, one per host."""
        pool = SSHHostPool(n, gpus=gpus, mode=mode)
        pools.append(pool)
        pool.start()
        return pool

    return make, pools


@pytest.fixture
def ssh_hosts() -> Iterator[HostFactory]:
    """`make(n, gpus=None)` → a started SSHHostPool; every pool is torn down after the test."""
    make, pools = _factory()
    try:
        yield make
    finally:
        for pool in pools:
            pool.close()


@pytest.fixture(scope="session")
def ssh_hosts_session() -> Iterator[HostFactory]:
    """Like `ssh_hosts`, but the pools live until the end of the test session."""
    make, pools = _factory()
    try:
        yield make
    finally:
        for pool in pools:
            pool.close()
