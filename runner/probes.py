"""Readiness probes of a running job, run by its job runner on the job's own host.

Each probe of the spec (``spec["probes"]``, runs/configuration/readiness.py) is called every
``interval`` against 127.0.0.1 (jobs and their containers use the host's network), or against the
node's own address when that is a loopback one (the local backend gives each node 127.0.0.x, and
two nodes on one machine listen on the same port each at its own): ``http`` passes
on a 2xx answer, ``tcp`` when a connection opens, ``exec`` when its command (argv, no shell; inside
the container for a container job) exits 0. A failure resets the probe's streak. The results are
written to the job's probes.json, which ``status`` reports with the job: the server learns them
from the look it makes anyway, never from a call of its own.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import subprocess
import threading
import time
from typing import Any

from .cluster_env import base_env
from .files import JobPaths, write_json_atomic

ERROR_CAP = 200  # characters of a failure kept in the status
BODY_CAP = 64 * 1024  # bytes of an answer read before it is closed


def probe_address(spec: dict[str, Any]) -> str:
    """Where a job's probes connect: 127.0.0.1 on a host of its own, the node's address when the node
    is one loopback address of several on one machine (a server bound to 127.0.0.1 would be another
    node's business there, and one bound to the node's address is not reachable at 127.0.0.1)."""
    try:
        node = ipaddress.ip_address(str(spec.get("node_ip") or ""))
    except ValueError:
        return "127.0.0.1"
    return str(node) if node.version == 4 and node.is_loopback else "127.0.0.1"


class Prober:
    """One thread per probe; results shared under a lock and written whole after every call."""

    def __init__(self, job: JobPaths, probes: list[dict[str, Any]], container: str | None = None,
                 address: str = "127.0.0.1") -> None:
        self.job = job
        self.address = address
        self.probes = probes
        self.container = container
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.results = [{"success_streak": 0, "calls": 0, "last_at": None, "last_error": None} for _ in probes]
        self.threads: list[threading.Thread] = []

    def start(self) -> Prober:
        if not self.probes:
            return self
        self._write()
        for i in range(len(self.probes)):
            thread = threading.Thread(target=self._loop, args=(i,), name=f"probe-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _loop(self, i: int) -> None:
        probe = self.probes[i]
        interval = float(probe.get("interval") or 15)
        ready_after = int(probe.get("ready_after") or 1)
        while not self.stopped.is_set():
            began = time.monotonic()
            error = self._call(probe)
            with self.lock:
                result = self.results[i]
                result["calls"] += 1
                result["last_at"] = time.time()
                result["last_error"] = error
                result["success_streak"] = result["success_streak"] + 1 if error is None else 0
                done = bool(probe.get("until_ready")) and result["success_streak"] >= ready_after
                if not self.stopped.is_set():
                    self._write()
            if done:
                return  # until_ready: no more calls once this probe has passed enough times
            self.stopped.wait(max(0.0, interval - (time.monotonic() - began)))

    def _write(self) -> None:
        try:
            write_json_atomic(self.job.probes, self.results)
        except OSError:
            pass  # the job directory is being removed: nobody will read it

    def _call(self, probe: dict[str, Any]) -> str | None:
        """None when the probe passed, else why not (short)."""
        timeout = float(probe.get("timeout") or 10)
        try:
            if probe["type"] == "http":
                return _http(self.address, probe, timeout)
            if probe["type"] == "tcp":
                socket.create_connection((self.address, int(probe["port"])), timeout=timeout).close()
                return None
            return self._exec(probe["command"], timeout)
        except Exception as e:  # noqa: BLE001 - any failure of a call is the probe's result
            return _short(f"{type(e).__name__}: {e}")

    def _exec(self, command: list[str], timeout: float) -> str | None:
        argv = ["docker", "exec", "--", self.container, *command] if self.container else list(command)
        env = base_env(self.job.home)
        # the marker: a stop of the job also stops a probe command still running
        env.update(entry.split("=", 1) for entry in self.job.marker)
        try:
            code = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  cwd=self.job.workdir if os.path.isdir(self.job.workdir) else None, env=env,
                                  timeout=timeout, close_fds=True, start_new_session=True).returncode
        except subprocess.TimeoutExpired:
            return f"no exit within {timeout:g}s"
        return None if code == 0 else f"exited with status {code}"


def _http(address: str, probe: dict[str, Any], timeout: float) -> str | None:
    conn = http.client.HTTPConnection(address, int(probe["port"]), timeout=timeout)
    try:
        headers = {str(h.get("name")): str(h.get("value")) for h in probe.get("headers") or []
                   if isinstance(h, dict)}
        body = probe.get("body")
        conn.request(str(probe.get("method") or "get").upper(), str(probe.get("url") or "/"),
                     body=body.encode() if isinstance(body, str) else None, headers=headers)
        answer = conn.getresponse()
        answer.read(BODY_CAP)
        if 200 <= answer.status < 300:
            return None
        return f"HTTP {answer.status}"
    finally:
        conn.close()


def _short(text: str) -> str:
    return text if len(text) <= ERROR_CAP else text[:ERROR_CAP - 3] + "..."


def probes_report(job: JobPaths) -> list[dict[str, Any]] | None:
    """The job's probe results for ``status`` (None when it has none)."""
    from .files import read_json

    found = read_json(job.probes)
    return found if isinstance(found, list) else None
