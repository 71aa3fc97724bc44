"""Soak of the embedded default: `muster serve` on SQLite + the filesystem broker, many small runs.

    .venv/bin/python -m bench.soak                      # 400 runs over about 4 minutes
    .venv/bin/python -m bench.soak --runs 100 --minutes 1

One real `muster serve` (web, worker, beat) on a free port and a scratch data directory, nothing
else: no PostgreSQL, no Redis. Runs of `echo` on the local fleet are submitted through the REST API
at an even pace (on a local fleet of 32, room for the runs in flight;
a run that finds none waits, `retry: on_events: [no-capacity]`, and is counted as retried), and each is followed to its
end. The figures: runs done / failed / not finished,
submit-to-done latency (median, p95, max), every `Unrecoverable error` in the output of serve and
its children, and every child `muster serve` restarted (a worker replaced without such a line
would be a death nobody was told about: the worker pids seen in /proc are checked against the
restart lines). Exit status 1 when a run did not end `done`, an unrecoverable error was logged or
a worker was replaced silently. A JSON copy goes to bench/results/soak-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# a run that finds every instance busy waits for one (retried on no-capacity) instead of failing
SMALL_RUN = "type: task\ncommands: [echo soak]\nretry:\n  on_events: [no-capacity]\n  duration: 10m\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """A real `muster serve` on the embedded default, its output in a file, its REST API at hand."""

    def __init__(self, data_dir: Path, concurrency: int = 2, env: dict | None = None, args: tuple[str, ...] = ()):
        self.args = args
        self.data_dir = Path(data_dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.data_dir / "serve.log"
        clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
        self.env = {**clean, "MUSTER_DATA_DIR": str(self.data_dir), "DJANGO_SETTINGS_MODULE": "muster.settings",
                    "PYTHONUNBUFFERED": "1", "MUSTER_DSTACK_SSH_BIND": f"127.0.0.1:{free_port()}", **(env or {})}
        self.concurrency = concurrency
        self.proc: subprocess.Popen | None = None
        self.token = ""

    def start(self, timeout: float = 180) -> ServeProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--bind", f"127.0.0.1:{self.port}",
             "--concurrency", str(self.concurrency), *self.args],
            cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"muster serve exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            found = re.search(r"^token: (\S+)$", self.log(), re.M)
            if found and self.answers():
                self.token = found.group(1)
                return self
            time.sleep(0.3)
        raise RuntimeError(f"muster serve did not come up in {timeout}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 30):
        req = urllib.request.Request(
            f"{self.url}/api/projects/main/{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"null")

    def submit(self, configuration: str = SMALL_RUN) -> str:
        return self.api("POST", "runs/", {"configuration": configuration})["name"]

    def status(self, run: str) -> str:
        return self.api("GET", f"runs/{run}/")["status"]

    def children(self) -> dict[int, str]:
        """pid -> what it is, for the processes serve started (web, worker, beat, gateway)."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
            if ppid == self.proc.pid:
                found[int(entry.name)] = ("worker" if " worker " in cmd else "beat" if " beat " in cmd
                                          else "gateway" if "dstack_gateway" in cmd
                                          else "web" if "runserver" in cmd or "gunicorn" in cmd else cmd)
        return found

    def pid_of(self, name: str) -> int | None:
        return next((pid for pid, what in self.children().items() if what == name), None)

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)
        finally:
            self._log.close()


def soak(runs: int, minutes: float, concurrency: int, fleet_size: int) -> dict:
    data = Path(tempfile.mkdtemp(prefix="muster-soak-"))
    # room for the runs in flight on a busy machine; one that still finds no room waits (retry)
    serve = ServeProcess(data, concurrency=concurrency, env={"MUSTER_LOCAL_FLEET_SIZE": str(fleet_size)}).start()
    print(f"soak: muster serve at {serve.url}, data in {data}; {runs} runs over {minutes:g} min, "
          f"local fleet of {fleet_size}", flush=True)
    submitted: dict[str, float] = {}
    ended: dict[str, tuple[str, float]] = {}
    errors: list[str] = []
    worker_pids: set[int] = set()
    retried: set[str] = set()
    lock = threading.Lock()
    stop_watching = threading.Event()

    def watch_workers() -> None:
        while not stop_watching.wait(0.5):
            pid = serve.pid_of("worker")
            if pid:
                worker_pids.add(pid)

    def follow() -> None:
        # every unfinished run looked at about twice a second: the latency is submit to seen done
        while not stop_watching.is_set():
            with lock:
                pending = [(n, at) for n, at in submitted.items() if n not in ended]
            for name, at in pending:
                try:
                    status = serve.status(name)
                except (OSError, urllib.error.URLError):
                    break
                if status in ("done", "failed", "terminated"):
                    with lock:
                        ended[name] = (status, time.monotonic() - at)
                elif status == "pending":  # only a retry puts a submitted run back to pending
                    retried.add(name)
            stop_watching.wait(0.5)

    threads = [threading.Thread(target=watch_workers, daemon=True), threading.Thread(target=follow, daemon=True)]
    for thread in threads:
        thread.start()
    gap = minutes * 60 / runs
    begin = time.monotonic()
    try:
        for i in range(runs):
            time.sleep(max(0.0, begin + i * gap - time.monotonic()))
            try:
                name = serve.submit()
            except (OSError, urllib.error.URLError) as exc:
                errors.append(f"submit {i}: {exc}")
                continue
            with lock:
                submitted[name] = time.monotonic()
        deadline = time.monotonic() + 300
        while len(ended) < len(submitted) and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        stop_watching.set()
        for thread in threads:
            thread.join(10)
        code = serve.stop()
    log = serve.log()
    latencies = sorted(t for status, t in ended.values() if status == "done")
    restart_lines = re.findall(r"^muster serve: (\w+) restarted", log, re.M)
    result = {
        "runs": runs, "minutes": minutes, "concurrency": concurrency, "fleet_size": fleet_size,
        "wall_seconds": round(time.monotonic() - begin, 1),
        "done": sum(1 for s, _ in ended.values() if s == "done"),
        "failed": sorted({s for s, _ in ended.values() if s != "done"}),
        "not_finished": len(submitted) - len(ended), "submit_errors": errors,
        "retried_for_capacity": len(retried),
        "latency_s": {"median": round(statistics.median(latencies), 2) if latencies else None,
                      "p95": round(latencies[int(0.95 * (len(latencies) - 1))], 2) if latencies else None,
                      "max": round(latencies[-1], 2) if latencies else None},
        "unrecoverable_errors": len(re.findall(r"Unrecoverable error", log)),
        "unreadable_messages": len(re.findall(r"set aside unreadable message", log)),
        "restarts_logged": restart_lines,
        "worker_pids_seen": len(worker_pids),
        "serve_exit": code, "data_dir": str(data),
    }
    # every worker after the first must have come with a restart line
    silent = len(worker_pids) - 1 - restart_lines.count("worker")
    result["silent_worker_replacements"] = max(0, silent)
    result["ok"] = (result["done"] == runs and not result["unrecoverable_errors"]
                    and not result["silent_worker_replacements"] and not errors)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=2, help="worker prefork children (muster serve's default)")
    parser.add_argument("--fleet-size", type=int, default=32, help="instances of the local fleet")
    args = parser.parse_args(argv)
    result = soak(args.runs, args.minutes, args.concurrency, args.fleet_size)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for key, value in result.items():
        print(f"{key:>28}: {value}")
    print(f"soak: {'ok' if result['ok'] else 'FAILED'}; {out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
