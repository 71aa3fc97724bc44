"""A test host's own dockerd (`SSHHostPool(n, docker=True)`, netns mode only; tests/sshhosts.py
says how it is run and torn down)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests import bounded_runc
from tests.sshhost_tools import _run


class HostDocker:
    """The Docker part of SSHHost: needs its `name`, `netns`, `docker_dir`, `docker_sock`,
    `_docker_announced`, `_write_config`, `sshd_running`, `stop_sshd` and `start_sshd`."""

    def start_dockerd(self, insecure_registries: Sequence[str] = (), timeout: float = 60) -> None:
        """Run a dockerd of the host's own in its network namespace; sessions get it as DOCKER_HOST."""
        if not self.netns:
            raise RuntimeError("a per-host dockerd needs netns mode")
        d = self.docker_dir
        d.mkdir(parents=True, exist_ok=True)
        sock = d / "docker.sock"
        cmd = [
            "nsenter", f"--net=/run/netns/{self.netns}", "dockerd",
            "--iptables=false", "--ip6tables=false", "--bridge=none",
            *[f"--insecure-registry={r}" for r in insecure_registries],
            "--data-root", str(d / "data"), "--exec-root", str(d / "exec"),
            "-H", f"unix://{sock}", "--pidfile", str(d / "dockerd.pid"),
        ]
        if bounded_runc.missing():
            # this machine's bounding set lacks capabilities that --privileged asks for: a runc wrapper
            # that leaves them out (tests/bounded_runc.py), so privileged containers start here too
            cmd += ["--add-runtime", f"bounded-runc={bounded_runc.install(d)}", "--default-runtime", "bounded-runc"]
        with open(d / "dockerd.log", "ab") as log:
            self._dockerd = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            if self._dockerd.poll() is not None:
                raise RuntimeError(f"dockerd of {self.name} exited: {(d / 'dockerd.log').read_text()[-2000:]}")
            ok = subprocess.run(["docker", "-H", f"unix://{sock}", "info"], capture_output=True, timeout=20)
            if ok.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"dockerd of {self.name} did not answer within {timeout} s")
            time.sleep(0.2)
        self.docker_sock = sock
        self._write_config()

    def announce_docker(self) -> None:
        """Give sessions DOCKER_HOST for the dockerd `start_dockerd` runs later, before it runs (sshd
        restarted). Like a machine's default socket, it exists once Docker is there: a runner agent
        started before then reaches the daemon without restarting, and docker fails until then."""
        self._docker_announced = True
        self._write_config()
        if self.sshd_running:
            self.stop_sshd()
            self.start_sshd()

    def docker(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The docker CLI against this host's daemon."""
        if self.docker_sock is None:
            raise RuntimeError(f"{self.name} runs no dockerd")
        return _run(["docker", "-H", f"unix://{self.docker_sock}", *args], check=check, timeout=timeout)

    def containers(self) -> list[str]:
        """Names of every container on the host's daemon, running or not."""
        out = self.docker("ps", "-a", "--format", "{{.Names}}").stdout
        return [name for name in out.split() if name]

    def stop_dockerd(self) -> None:
        proc = getattr(self, "_dockerd", None)
        if proc is None:
            return
        if proc.poll() is None and self.docker_sock is not None:
            # Containers first, while the daemon answers: a daemon stopped with containers running
            # stops each itself (10 s per PID 1 that ignores SIGTERM) and may leave shims behind.
            ids = self.docker("ps", "-aq", check=False).stdout.split()
            if ids:
                self.docker("rm", "-f", *ids, check=False, timeout=60)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._dockerd = None
        self.docker_sock = None
        marker = str(self.docker_dir).encode()
        for entry in Path("/proc").iterdir():  # containerd and shims started by this daemon
            if entry.name.isdigit():
                try:
                    if marker in (entry / "cmdline").read_bytes():
                        os.kill(int(entry.name), signal.SIGKILL)
                except OSError:
                    pass
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(self.docker_dir))]
        for mount in sorted(mounts, key=len, reverse=True):
            if _run(["umount", mount], check=False).returncode != 0:
                _run(["umount", "-l", mount], check=False)
