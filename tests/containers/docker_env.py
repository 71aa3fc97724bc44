"""Real Docker for the container tests: SSH test hosts with a dockerd each, images built from
busybox-static, and a local registry on the test bridge (shared/reference/docker-in-netns.md).

Everything is started once per test session (`docker_cluster`), since daemons, registry and images
take seconds to come up on a loaded machine; tests use image tags of their own where they need a
fresh pull.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tarfile
import tempfile
import time
import urllib.error
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
    if os.path.exists("/run/containerd/containerd.sock"):
        # every test dockerd would use it, and its containers would start outside the host's namespace
        return "a system containerd runs (/run/containerd/containerd.sock): stop it (systemctl stop containerd)"
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
    registries: list[Registry]

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

    def push_private(self, registry: Registry, name: str, marker: str) -> str:
        """Build an image and push it to the registry with basic auth (a throw-away client config)."""
        ref = f"{registry.addr}/test/{name}"
        builder = self.pool[0]
        subprocess.run(["docker", "-H", f"unix://{builder.docker_sock}", "import", "-", ref],
                       input=rootfs_tar(marker), capture_output=True, check=True, timeout=60)
        config = tempfile.mkdtemp()
        try:
            client = ["docker", "--config", config, "-H", f"unix://{builder.docker_sock}"]
            subprocess.run([*client, "login", "-u", "tester", "--password-stdin", registry.addr],
                           input=registry.password, capture_output=True, text=True, check=True, timeout=60)
            subprocess.run([*client, "push", ref], capture_output=True, check=True, timeout=120)
        finally:
            shutil.rmtree(config, ignore_errors=True)
        builder.docker("rmi", ref)
        return ref

    def forget(self, ref: str) -> None:
        """Remove the image from every host, so that the next job there has to pull it."""
        for host in self.pool:
            host.docker("rmi", "-f", ref, check=False)

    def leftover_containers(self) -> dict[str, list[str]]:
        return {h.name: h.containers() for h in self.pool if h.containers()}


class Registry:
    """docker-registry serving from a directory of its own on the bridge address; with `password`,
    TLS (self-signed: the daemons trust the bridge address as an insecure registry) and basic auth
    for the user `tester`."""

    def __init__(self, root: Path, address: str, port: int, password: str = "") -> None:
        self.addr = f"{address}:{port}"
        self.root = root
        self.password = password
        storage = root / f"registry-{port}"
        config = root / f"registry-{port}.yml"
        http = f"http: {{addr: '{self.addr}'}}\n"
        auth = ""
        if password:
            cert, key, users = root / f"cert-{port}.pem", root / f"key-{port}.pem", root / f"htpasswd-{port}"
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-subj", f"/CN={address}", "-addext", f"subjectAltName=IP:{address}",
                            "-keyout", str(key), "-out", str(cert)], capture_output=True, check=True, timeout=60)
            users.write_text(subprocess.run(["htpasswd", "-Bbn", "tester", password], capture_output=True,
                                            text=True, check=True, timeout=60).stdout)
            http = f"http: {{addr: '{self.addr}', tls: {{certificate: {cert}, key: {key}}}}}\n"
            # every dockerd reads this directory at each pull: the daemons trust the certificate
            self.certs_d = Path("/etc/docker/certs.d") / self.addr
            self.certs_d.mkdir(parents=True, exist_ok=True)
            shutil.copy(cert, self.certs_d / "ca.crt")
            auth = f"auth: {{htpasswd: {{realm: test, path: {users}}}}}\n"
        config.write_text(
            "version: 0.1\n"
            "log: {level: warn, accesslog: {disabled: true}}\n"
            f"storage: {{filesystem: {{rootdirectory: {storage}}}, delete: {{enabled: true}}}}\n"
            + http + auth
        )
        with open(root / f"registry-{port}.log", "ab") as log:
            self.proc = subprocess.Popen([REGISTRY, "serve", str(config)], stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, start_new_session=True)
        deadline = time.monotonic() + 30
        context = ssl._create_unverified_context() if password else None
        while True:
            try:
                urllib.request.urlopen(f"{'https' if password else 'http'}://{self.addr}/v2/", timeout=2,
                                       context=context).read()
                return
            except urllib.error.HTTPError as exc:
                if exc.code == 401:  # up, and asking for credentials
                    return
                raise
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"registry on {self.addr} did not come up") from None
                time.sleep(0.1)

    certs_d: Path | None = None

    def close(self) -> None:
        if self.certs_d is not None:
            shutil.rmtree(self.certs_d, ignore_errors=True)
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
    registries: list[Registry] = []
    try:
        pool.start()
        registries.append(Registry(pool.root, pool.bridge_address, 5000))
        yield DockerCluster(pool, registries[0].addr, registries)
    finally:
        for registry in registries:
            registry.close()
        pool.close()


def private_registry(cluster: DockerCluster, password: str) -> Registry:
    """The registry with basic auth, started once (its storage and password live as long as the cluster)."""
    for registry in cluster.registries:
        if registry.password:
            return registry
    registry = Registry(cluster.pool.root, cluster.pool.bridge_address, 5001, password=password)
    cluster.registries.append(registry)
    return registry
