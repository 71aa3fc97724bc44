"""Real Docker for the container tests: SSH test hosts with a dockerd each, images built from
busybox-static, and a local registry on the test bridge (shared/reference/docker-in-netns.md).

Everything is started once per test session (`docker_cluster`), since daemons, registry and images
take seconds to come up on a loaded machine; tests use image tags of their own where they need a
fresh pull.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.sshhosts import SSHHostPool

REGISTRY = "/usr/bin/docker-registry"
BUSYBOX = "/bin/busybox"
L40S = ("L40S", 46068)  # as tests/ssh_e2e/helpers.py (not imported: that module needs Django set up)


def _missing() -> str:
    if os.geteuid() != 0:
        return "needs root (network namespaces and dockerd)"
    for tool in ("ip", "nsenter", "dockerd", "docker", "containerd", "runc"):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install docker.io iproute2 util-linux)"
    if not os.path.exists("/usr/sbin/sshd"):
        return "needs OpenSSH sshd"
    if not os.path.exists(REGISTRY):
        return "needs docker-registry (apt-get install docker-registry)"
    if not os.path.exists(BUSYBOX) or b"ld-linux" in Path(BUSYBOX).read_bytes()[:4096]:
        return "needs a static /bin/busybox (apt-get install busybox-static)"
    return ""


MISSING = _missing()
needs_docker = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=MISSING or "ok"),
]


def rootfs_tar(marker: str) -> bytes:
    """A busybox userland plus /etc/test-image-marker (a file only this image has), as a tar."""
    with tempfile.TemporaryDirectory() as root:
        r = Path(root)
        for d in ("bin", "etc", "tmp", "root", "proc", "sys", "dev", "workflow"):
            (r / d).mkdir()
        (r / "tmp").chmod(0o1777)
        shutil.copy(BUSYBOX, r / "bin" / "busybox")
        applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
        for applet in applets:
            if applet != "busybox":
                (r / "bin" / applet).symlink_to("busybox")
        (r / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/tmp:/bin/sh\n")
        (r / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        (r / "etc" / "test-image-marker").write_text(marker + "\n")
        out = Path(root + ".tar")
        with tarfile.open(out, "w") as tar:
            tar.add(root, arcname=".", filter=_numeric_owner)
        data = out.read_bytes()
        out.unlink()
        return data


def _numeric_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uname = info.gname = ""
    return info


@dataclass
class DockerCluster:
    pool: SSHHostPool
    registry: str  # host:port of the open registry

    def image(self, name: str) -> str:
        return f"{self.registry}/test/{name}"

    def push(self, name: str, marker: str) -> str:
        """Build an image with this marker, push it to the registry, and leave no copy on any host."""
        ref = self.image(name)
        builder = self.pool[0]
        subprocess.run(["docker", "-H", f"unix://{builder.docker_sock}", "import", "-c", 'CMD ["/bin/sh"]', "-", ref],
                       input=rootfs_tar(marker), capture_output=True, check=True, timeout=60)
        builder.docker("push", ref, timeout=120)
        builder.docker("rmi", ref)
        return ref

    def privileged_refused(self, ref: str) -> str:
        """Docker's error when this machine cannot run privileged containers (a sandbox that withholds
        capabilities from its root), else ""."""
        out = self.pool[0].docker("run", "--rm", "--privileged", "--network", "host", ref, "true", check=False)
        return "" if out.returncode == 0 else (out.stderr.strip() or out.stdout.strip())[-300:]

    def forget(self, ref: str) -> None:
        """Remove the image from every host, so that the next job there has to pull it."""
        for host in self.pool:
            host.docker("rmi", "-f", ref, check=False)

    def leftover_containers(self) -> dict[str, list[str]]:
        return {h.name: h.containers() for h in self.pool if h.containers()}


class Registry:
    """docker-registry serving from a directory of its own on the bridge address."""

    def __init__(self, root: Path, address: str, port: int) -> None:
        self.addr = f"{address}:{port}"
        self.root = root
        storage = root / f"registry-{port}"
        config = root / f"registry-{port}.yml"
        config.write_text(
            "version: 0.1\n"
            "log: {level: warn, accesslog: {disabled: true}}\n"
            f"storage: {{filesystem: {{rootdirectory: {storage}}}, delete: {{enabled: true}}}}\n"
            f"http: {{addr: '{self.addr}'}}\n"
        )
        with open(root / f"registry-{port}.log", "ab") as log:
            self.proc = subprocess.Popen([REGISTRY, "serve", str(config)], stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{self.addr}/v2/", timeout=2).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"registry on {self.addr} did not come up") from None
                time.sleep(0.1)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(scope="session")
def docker_cluster() -> Iterator[DockerCluster]:
    """Three hosts with Docker (one CPU host, two with 2 x L40S), and the open registry."""
    if MISSING:
        pytest.skip(MISSING)
    pool = SSHHostPool(3, gpus=[[], [L40S, L40S], [L40S, L40S]], mode="netns", docker=True)
    registry = None
    try:
        pool.start()
        registry = Registry(pool.root, pool.bridge_address, 5000)
        yield DockerCluster(pool, registry.addr)
    finally:
        if registry is not None:
            registry.close()
        pool.close()
