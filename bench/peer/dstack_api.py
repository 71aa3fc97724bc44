"""dstack 0.22.5's server, started for the side by side, and its HTTP API as the CLI calls it.

The server runs from its own venv (`.venv-peer/`, `make bench-peer` makes it; dstack is not a Muster
dependency) on its default SQLite, in a scratch HOME and DSTACK_SERVER_DIR, with an admin token we
choose (DSTACK_SERVER_ADMIN_TOKEN), so nothing of a user's ~/.dstack is read or written. Requests
are the CLI's (/work/shared/reference/dstack-cli-protocol.md): every call a POST with JSON,
`Authorization: Bearer`, `X-API-VERSION: 0.22.5`; the run spec carries the configuration as the CLI
dumps it, client-side resource defaults included.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import uuid
from pathlib import Path

VERSION = "0.22.5"
ROOT = Path(__file__).resolve().parent.parent.parent
VENV = Path(os.environ.get("BENCH_PEER_VENV", ROOT / ".venv-peer"))
PROJECT = "main"  # the project dstack's server creates on first start


def configuration(nodes: int, gpu: str | None = None) -> dict:
    """A `type: task, nodes: N, commands: [echo]` dump with the CLI's defaults (cpu 2.., 8GB.., 100GB..)."""
    gpu_spec: dict = {"vendor": None, "name": None, "count": {"min": 0, "max": None}, "memory": None,
                      "total_memory": None, "compute_capability": None}
    if gpu:
        name, count = gpu.split(":")
        gpu_spec = {**gpu_spec, "name": [name], "count": {"min": int(count), "max": int(count)}}
    return {"type": "task", "nodes": nodes, "commands": ["echo"], "env": {}, "ports": [],
            "resources": {"cpu": {"arch": None, "count": {"min": 2, "max": None}}, "memory": {"min": 8.0, "max": None},
                          "shm_size": None, "gpu": gpu_spec, "disk": {"size": {"min": 100.0, "max": None}}},
            "retry": False}


def run_spec(nodes: int, gpu: str | None = None, ssh_key_pub: str = "") -> dict:
    # no run_name: the server names each run, as Muster's bench task has no `name:`
    return {"run_name": None, "repo_id": None, "repo_data": None, "repo_code_hash": None,
            "working_dir": None, "configuration_path": "bench.dstack.yml",
            "configuration": configuration(nodes, gpu), "profile": None, "ssh_key_pub": ssh_key_pub}


def plan_body(spec: dict) -> dict:
    return {"run_spec": spec, "max_offers": 3}


def apply_body(plan: dict) -> dict:
    """What the CLI sends after a plan: the plan's run_spec (not the effective one), no current run."""
    return {"plan": {"run_spec": plan["run_spec"], "current_resource": plan.get("current_resource")},
            "force": False}


def headers(token: str) -> dict:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json",
            "X-API-VERSION": VERSION}


def paths(project: str = PROJECT) -> dict:
    base = f"/api/project/{project}/"
    return {"plan": base + "runs/get_plan", "apply": base + "runs/apply", "get": base + "runs/get", "stop": base + "runs/stop",
            "list": "/api/runs/list"}


class Server:
    """One `dstack server` on SQLite in a scratch dir; `stop()` ends its process group."""

    def __init__(self, session, port: int):
        self.session, self.port = session, port
        self.dir = session.data_dir / "dstack"
        self.dir.mkdir(exist_ok=True)
        self.token = uuid.uuid4().hex
        self.db = self.dir / "server" / "data" / "sqlite.db"

    def start(self, timeout: float = 120) -> None:
        exe = VENV / "bin" / "dstack"
        if not exe.exists():
            raise RuntimeError(f"{exe} missing: `make bench-peer` installs dstack {VERSION} there")
        env = {"HOME": str(self.dir), "DSTACK_SERVER_DIR": str(self.dir / "server"),
               "DSTACK_SERVER_ADMIN_TOKEN": self.token, "DSTACK_DO_NOT_UPDATE_DEFAULT_PROJECT": "1",
               "DSTACK_SERVER_LOG_LEVEL": "WARNING", "DSTACK_CLI_LOG_LEVEL": "WARNING",
               "PYTHONPATH": ""}
        self.session.start("dstack", [str(exe), "server", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--token", self.token, "-y"], env=env)
        deadline = time.time() + timeout
        while True:
            try:
                self.call(f"/api/projects/{PROJECT}/get", None)
                return
            except (OSError, RuntimeError) as exc:
                if self.session.procs["dstack"].poll() is not None or time.time() > deadline:
                    log = (self.session.data_dir / "dstack.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"dstack server did not start ({exc}):\n{log}") from exc
                time.sleep(0.5)

    def call(self, path: str, body: dict | None, conn: http.client.HTTPConnection | None = None):
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("POST", path, body=b"" if body is None else json.dumps(body).encode(),
                         headers=headers(self.token))
            resp = conn.getresponse()
            data = resp.read()
        finally:
            if own:
                conn.close()
        if resp.status >= 300:
            raise RuntimeError(f"{path}: {resp.status} {data[:500]!r}")
        return json.loads(data) if data else None

    def stop(self) -> None:
        self.session.stop("dstack")


