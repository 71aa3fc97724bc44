"""Shared helpers for the runner tests: the runner package's functions, and its zipapp's CLI."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from backends.runner_archive import runner_archive
from tests.waiting import wait_until

# The zipapp the hosts get (runner/shipping.py): the CLI is always driven through it, as they run it.
RUNNER_PATH = runner_archive()
# Hosts run the file with whatever python3 they have (3.8+); point this at an old interpreter to check it.
RUNNER_PYTHON = os.environ.get("MUSTER_RUNNER_PYTHON", sys.executable)
RUNNER_MODULES = ("agent", "cgroups", "cluster_env", "commands", "containers", "files", "images", "job",
                  "lifecycle", "processes", "protocol")


def load_runner_module() -> Any:
    """The runner package's modules as one namespace, for tests of single functions."""
    found: dict[str, Any] = {}
    for name in RUNNER_MODULES:
        found.update(vars(importlib.import_module(f"runner.{name}")))
    return SimpleNamespace(**found)


def cli(
    home: Path, *args: str, stdin: bytes | None = None, timeout: float = 15
) -> subprocess.CompletedProcess:
    command = [RUNNER_PYTHON, str(RUNNER_PATH), args[0], "--home", str(home), *args[1:]]
    return subprocess.run(command, input=stdin, capture_output=True, timeout=timeout, check=False)


def cli_json(home: Path, *args: str, stdin: bytes | None = None) -> dict[str, Any]:
    result = cli(home, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def submit(home: Path, job_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    return cli_json(home, "submit", "--job", job_id, stdin=json.dumps(spec).encode())


def job_spec(job_id: str, commands: list[str], **overrides: Any) -> dict[str, Any]:
    spec = {
        "job_id": job_id,
        "run_name": "test-run",
        "job_num": 0,
        "nodes_num": 1,
        "node_group_name": "main",
        "node_group_index": 0,
        "node_group_rank": 0,
        "commands": commands,
        "env": {},
        "max_duration": None,
        "stop_grace": 1,
        "node_ip": "127.0.0.1",
        "gpus": 0,
        "cluster_info": {"job_ips": ["127.0.0.1"], "master_job_ip": "127.0.0.1", "gpus_per_node": [0]},
        "tpu": None,
    }
    spec.update(overrides)
    return spec


def job_status(home: Path, job_id: str) -> dict[str, Any] | None:
    try:
        return json.loads((home / "jobs" / job_id / "status.json").read_text())
    except (OSError, ValueError):
        return None


def wait_state(home: Path, job_id: str, states: tuple[str, ...], timeout: float = 10) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        status = job_status(home, job_id)
        return status if status and status.get("state") in states else None

    return wait_for(reached, timeout, f"job {job_id} to reach {states}")


def process_state(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()[0]


def alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's zombie may wait for a PID 1 that never reaps it)."""
    return process_state(pid) not in (None, "Z", "X")


def group_members(pgid: int) -> list[int]:
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                raw = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rfind(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(name))
    return members


def agent_pids(home: Path) -> list[int]:
    """Live agent processes serving ``home``, found from their command lines."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"agent" in argv and str(home).encode() in argv and alive(int(name)):
            pids.append(int(name))
    return pids


def kill_everything(home: Path) -> None:
    """Teardown: no agent, job runner or job process of this home may survive the test."""
    for pid in agent_pids(home):
        os.kill(pid, signal.SIGKILL)
    jobs = home / "jobs"
    for job_dir in jobs.iterdir() if jobs.is_dir() else []:
        status = job_status(home, job_dir.name) or {}
        for pid in (status.get("runner_pid"), status.get("pgid")):
            if isinstance(pid, int) and alive(pid):
                os.kill(pid, signal.SIGKILL)
        if isinstance(status.get("pgid"), int):
            for member in group_members(status["pgid"]):
                os.kill(member, signal.SIGKILL)
        remove_cgroup(status.get("cgroup"))


def remove_cgroup(path: Any) -> None:
    """A job's cgroup stays busy until init reaps its killed orphans, which may be after the job ended."""
    if not isinstance(path, str) or not os.path.basename(path).startswith("muster-"):
        return

    def removed() -> bool:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    try:
        wait_until(removed, 30, f"{path} to be removable", interval=0.2)
    except AssertionError:
        pass  # left empty; never worth failing a test over


def wait_for(predicate: Callable[[], Any], timeout: float = 10, what: str = "condition") -> Any:
    return wait_until(predicate, timeout, what, interval=0.05)


ESCAPES = Path(__file__).resolve().parent / "escapes.py"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def escape_commands(token: str, ports: tuple[int, int]) -> list[str]:
    """Job commands that leave behind `timeout`, `setsid` and a double-forking daemon (escapes.py)."""
    return [f"{sys.executable} {ESCAPES} {token} {ports[0]} {ports[1]}"]


def port_in_use(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def escaped_processes(token: str, ports: tuple[int, int]) -> list[str]:
    """Command lines of live processes the escape commands started (found without the runner's help)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or not alive(int(name)):
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if any(a.startswith(f"{token}-") for a in text) or ("http.server" in text and str(ports[0]) in text):
            found.append(" ".join(text))
    return found


def kill_escapes(token: str, ports: tuple[int, int]) -> None:
    """Teardown for the old code under test: what escaped must not outlive the test either."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                argv = Path(f"/proc/{name}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            except OSError:
                continue
            text = [a.decode(errors="replace") for a in argv]
            if any(a.startswith(f"{token}-") for a in text) or ("http.server" in text and str(ports[0]) in text) \
                    or (text[:1] == ["timeout"] and str(ports[0]) in text):
                try:
                    os.kill(int(name), signal.SIGKILL)
                except OSError:
                    pass


def nothing_of_the_job_left(token: str, ports: tuple[int, int]) -> bool:
    return not escaped_processes(token, ports) and not any(port_in_use(p) for p in ports)
