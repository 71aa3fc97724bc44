"""Soak of the embedded default: `muster serve` on SQLite + the filesystem broker, many small runs.

    .venv/bin/python -m bench.soak                      # 450 2-node runs over 5 minutes (1.5 runs/s)
    .venv/bin/python -m bench.soak --runs 100 --minutes 1 --nodes 1
    .venv/bin/python -m bench.soak --store postgres     # the same on PostgreSQL + Redis

One real `muster serve` (web, worker, beat) on a free port and a scratch data directory, nothing
else: no PostgreSQL, no Redis (`--store postgres`: a scratch database on BENCH_PG and Redis db
BENCH_REDIS_DB, 14 by default, both emptied first and dropped or flushed after). Runs of `echo`
on `--nodes` nodes of the local fleet are submitted through the REST API at an even pace (on a
local fleet of 32; a run that finds the fleet full waits for a host, `retry: on_events:
[no-capacity]`, and is counted as waited, or as retried if it went back to pending), and each is
followed to its end. The load drains when
every run is terminal within `--drain` seconds (60) of the last submit. The figures: runs done /
failed / not finished, seconds from the last submit to the last run's end,
submit-to-done latency (median, p95, max), every `Unrecoverable error` in the output of serve and
its children, and every child `muster serve` restarted (a worker replaced without such a line
would be a death nobody was told about: the worker pids seen in /proc are checked against the
restart lines). Exit status 1 when a run did not end `done`, an unrecoverable error was logged or
a worker was replaced silently, or the load did not drain in time. A JSON copy goes to
bench/results/soak-<timestamp>.json.
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
PG = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379")


def small_run(nodes: int) -> str:
    return SMALL_RUN if nodes == 1 else f"type: task\nnodes: {nodes}\n" + SMALL_RUN.split("\n", 1)[1]


class ServerStore:
    """`--store postgres`: a scratch PostgreSQL database and a Redis db for one soak, emptied first."""

    def __init__(self, name: str = "muster_soak", redis_db: int | None = None):
        self.name = os.environ.get("BENCH_SOAK_DB", name)
        self.redis_db = redis_db if redis_db is not None else int(os.environ.get("BENCH_REDIS_DB", "14"))
        self.env = {"DATABASE_URL": f"{PG}/{self.name}", "CELERY_BROKER_URL": f"{REDIS}/{self.redis_db}"}

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            conn.execute(sql)

    def _flush(self) -> None:
        import redis

        redis.Redis.from_url(f"{REDIS}/{self.redis_db}").flushdb()

    def create(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self._admin(f'CREATE DATABASE "{self.name}"')
        self._flush()

    def drop(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self._flush()

    def describe(self) -> str:
        return f"PostgreSQL {PG}/{self.name} + Redis {REDIS}/{self.redis_db}"


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
        # the embedded default unless `env` names a database and a broker
        clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
        self.env = {**clean, "MUSTER_DATA_DIR": str(self.data_dir), "DJANGO_SETTINGS_MODULE": "muster.settings",
                    "PYTHONUNBUFFERED": "1", "MUSTER_DSTACK_SSH_BIND": f"127.0.0.1:{free_port()}",
                    "MUSTER_ENDPOINT_BIND": f"127.0.0.1:{free_port()}", **(env or {})}
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

    def look(self, run: str) -> tuple[str, bool]:
        """The run's status, and whether a job of it waits for a host of a full fleet."""
        answer = self.api("GET", f"runs/{run}/")
        waits = any(str(j.get("waiting_for") or "").startswith("a free host") for j in answer.get("jobs") or [])
        return answer["status"], waits

    def children(self) -> dict[int, str]:
        """pid -> what it is, for the processes serve started (web, worker, beat, gateway, endpoint)."""
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
                                          else "endpoint" if "serve_endpoint" in cmd
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


def soak(runs: int, minutes: float, concurrency: int, fleet_size: int, nodes: int = 1, drain: float = 60,
         store: ServerStore | None = None) -> dict:
    data = Path(tempfile.mkdtemp(prefix="muster-soak-"))
    # room for the runs in flight on a busy machine; one that still finds no room waits (retry)
    env = {"MUSTER_LOCAL_FLEET_SIZE": str(fleet_size), **(store.env if store else {})}
    serve = ServeProcess(data, concurrency=concurrency, env=env).start()
    configuration = small_run(nodes)
    where = store.describe() if store else "embedded: SQLite + filesystem broker"
    print(f"soak: muster serve at {serve.url} on {where}, data in {data}; {runs} runs of {nodes} node(s) over "
          f"{minutes:g} min ({runs / (minutes * 60):.2f} runs/s), local fleet of {fleet_size}", flush=True)
    submitted: dict[str, float] = {}
    ended: dict[str, tuple[str, float]] = {}
    errors: list[str] = []
    worker_pids: set[int] = set()
    retried: set[str] = set()
    waited: set[str] = set()
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
                    status, waits = serve.look(name)
                except (OSError, urllib.error.URLError):
                    break
                if status in ("done", "failed", "terminated"):
                    with lock:
                        ended[name] = (status, time.monotonic() - at)
                elif status == "pending":  # only a retry puts a submitted run back to pending
                    retried.add(name)
                if waits:
                    waited.add(name)
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
                name = serve.submit(configuration)
            except (OSError, urllib.error.URLError) as exc:
                errors.append(f"submit {i}: {exc}")
                continue
            with lock:
                submitted[name] = time.monotonic()
        last_submit = time.monotonic()
        # the drain is judged at `drain` s; the wait goes on a while after that, to say how late it was
        deadline = last_submit + max(300, drain)
        while len(ended) < len(submitted) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        stop_watching.set()
        for thread in threads:
            thread.join(10)
        code = serve.stop()
    log = serve.log()
    latencies = sorted(t for status, t in ended.values() if status == "done")
    # when each run was seen ending, as seconds after the last submit (its latency from its own submit)
    ends_after_last = [submitted[n] + t - last_submit for n, (_, t) in ended.items()]
    drained_in = round(max(ends_after_last), 2) if ends_after_last and len(ended) == len(submitted) else None
    restart_lines = re.findall(r"^muster serve: (\w+) restarted", log, re.M)
    result = {
        "runs": runs, "minutes": minutes, "nodes": nodes, "rate_per_s": round(runs / (minutes * 60), 2),
        "store": where, "concurrency": concurrency, "fleet_size": fleet_size,
        "wall_seconds": round(time.monotonic() - begin, 1),
        "done": sum(1 for s, _ in ended.values() if s == "done"),
        "failed": sorted({s for s, _ in ended.values() if s != "done"}),
        "not_finished": len(submitted) - len(ended), "submit_errors": errors,
        # seconds from the last submit until every run was seen terminal (None: some never were)
        "drained_s_after_last_submit": drained_in, "drain_limit_s": drain,
        "terminal_by_drain_limit": sum(1 for t in ends_after_last if t <= drain),
        "retried_for_capacity": len(retried),
        # runs seen waiting for a host of the full fleet (engine/submitted/waiting.py) instead of retrying
        "waited_for_a_host": len(waited),
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
                    and not result["silent_worker_replacements"] and not errors
                    and drained_in is not None and drained_in <= drain)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=450)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--nodes", type=int, default=2, help="nodes per run")
    parser.add_argument("--drain", type=float, default=60, help="seconds after the last submit by which every run "
                                                               "must be terminal")
    parser.add_argument("--store", choices=["embedded", "postgres"], default="embedded",
                        help="embedded: SQLite + filesystem broker (the default a user gets); postgres: "
                             "PostgreSQL + Redis (scratch database BENCH_SOAK_DB, Redis db BENCH_REDIS_DB)")
    parser.add_argument("--concurrency", type=int, default=2, help="worker prefork children (muster serve's default)")
    parser.add_argument("--fleet-size", type=int, default=32, help="instances of the local fleet")
    args = parser.parse_args(argv)
    store = ServerStore() if args.store == "postgres" else None
    if store:
        store.create()
    try:
        result = soak(args.runs, args.minutes, args.concurrency, args.fleet_size, args.nodes, args.drain, store)
    finally:
        if store:
            store.drop()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for key, value in result.items():
        print(f"{key:>28}: {value}")
    print(f"soak: {'ok' if result['ok'] else 'FAILED'}; {out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
