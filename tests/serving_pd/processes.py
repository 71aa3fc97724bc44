"""Real PD processes for the tests: the `smg` router from PyPI and stand-in SGLang workers
(serving/standin.py), each on a loopback address of its own, and what smg lists."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
STANDIN = ROOT / "serving" / "standin.py"
# a /24 of 127/8 per test process, apart from tests/serving's (127.100-199.x)
NET = f"127.{40 + os.getpid() % 50}.{os.getpid() % 250}"


def smg_binary() -> str:
    found = shutil.which("smg") or str(Path(sys.executable).parent / "smg")
    if not Path(found).exists():
        pytest.skip("smg is not installed (pip install smg: the dev extra has it)")
    return found


def address(k: int) -> str:
    return f"{NET}.{k}"


def wait_port(host: str, port: int, timeout: float = 20, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited with {proc.returncode}")
        try:
            socket.create_connection((host, port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {host}:{port} after {timeout}s")


class Processes:
    def __init__(self, tmp: Path):
        self.tmp, self.procs = tmp, []

    def standin(self, host: str, port: int, role: str, *extra: str) -> subprocess.Popen:
        log = (self.tmp / f"standin-{host}-{port}.log").open("ab")
        proc = subprocess.Popen([sys.executable, str(STANDIN), "--host", host, "--port", str(port), "--role", role,
                                 *extra], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        wait_port(host, port, proc=proc)
        return proc

    def smg(self, host: str, port: int, *extra: str) -> subprocess.Popen:
        log = (self.tmp / f"smg-{host}-{port}.log").open("ab")
        proc = subprocess.Popen([smg_binary(), "launch", "--host", host, "--port", str(port), "--pd-disaggregation",
                                 "--prometheus-host", host, "--prometheus-port", str(free_port(host)),
                                 "--log-level", "warn", *extra],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        wait_port(host, port, timeout=30, proc=proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the stand-ins and smg lead their own sessions
                except ProcessLookupError:
                    proc.kill()
            proc.wait(10)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def workers(host: str, port: int) -> list[dict]:
    """What smg at host:port lists (GET /workers)."""
    with urllib.request.urlopen(f"http://{host}:{port}/workers", timeout=10) as answer:
        return json.loads(answer.read())["workers"]


def listed(host: str, port: int) -> set[tuple[str, str]]:
    """(url, role) of the workers smg lists and is not draining."""
    return {(w["url"], w["worker_type"]) for w in workers(host, port) if w.get("status") != "draining"}


def post(url: str, body: dict, timeout: float = 30) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def routed(name: str, project: str = "main") -> set[int]:
    """The jobs the endpoint routes service `name` to (serving/routes.py): a router only once the
    router sync saw it serve, a little after smg lists its workers."""
    from serving.routes import service

    found = service(project, name)
    return {r.job_id for r in found.replicas} if found is not None else set()
