"""The bench session: its own database, broker, data directory and processes, all cleaned up.

PostgreSQL + Redis by default (database `muster_bench`, Redis db 15 on 127.0.0.1:6379), or the
embedded default (SQLite + filesystem broker) with --embedded. Every process the session starts
carries BENCH_SESSION=<id> in its environment, so leftovers can be found by that mark alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379")
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- /proc readers -------------------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # fields from `state` on (index 0 = field 3)


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st:
                out.setdefault(int(st[1]), []).append(int(entry))
    return out


def tree(pid: int) -> list[int]:
    kids = children_map()
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        st = _stat(p)
        if st is None or st[0] == "Z":  # gone, or dead and not yet reaped
            continue
        seen.append(p)
        todo.extend(kids.get(p, []))
    return seen


def cpu_seconds(pids: list[int]) -> float:
    """utime+stime (+ reaped children's) of each live process in the trees rooted at `pids`."""
    total = 0
    for root in pids:
        for p in tree(root):
            st = _stat(p)
            if st:
                total += sum(int(st[i]) for i in (11, 12, 13, 14))
    return total / CLK


def rss_mib(pid: int) -> float:
    st = _stat(pid)
    return int(st[21]) * PAGE / 2**20 if st else 0.0


def tree_rss(pid: int) -> dict[str, float]:
    per = [rss_mib(p) for p in tree(pid)]
    return {"processes": len(per), "max_mib": round(max(per, default=0), 1), "sum_mib": round(sum(per), 1)}


def marked_processes(session: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if f"BENCH_SESSION={session}".encode() in env.split(b"\0"):
            found.append(int(entry))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the session ---------------------------------------------------------------------------------

class Session:
    def __init__(self, embedded: bool = False, db_name: str | None = None, redis_url: str | None = None,
                 redis_db: int | None = None, extra_env: dict[str, str] | None = None, log=print,
                 count: bool = True):
        """`count`: statements and tasks counted into Redis (bench/instrument.py) by every process
        started; off, they run as the product runs (bench-peer, which compares with an uninstrumented
        dstack and prints no counts)."""
        # BENCH_DB_NAME / BENCH_REDIS_DB let two sessions share one machine without sharing rows or queues
        db_name = db_name or os.environ.get("BENCH_DB_NAME", "muster_bench")
        redis_db = redis_db if redis_db is not None else int(os.environ.get("BENCH_REDIS_DB", "15"))
        self.embedded = embedded
        self.id = uuid.uuid4().hex[:12]
        self.data_dir = Path(tempfile.mkdtemp(prefix="muster-bench-"))
        self.db_name = db_name
        self.redis_base = redis_url or REDIS
        self.redis_db = redis_db
        self.procs: dict[str, subprocess.Popen] = {}
        self.worker_nice: int | None = None  # MUSTER_WORKER_NICE the running workers got (None: unset)
        self.log = log
        self.env = {
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "MUSTER_DATA_DIR": str(self.data_dir),
            "BENCH_SESSION": self.id,
            "SECRET_KEY": "bench-" + self.id,
            "PYTHONPATH": str(ROOT),
            **({"BENCH_STATS_URL": f"{self.redis_base}/{redis_db}"} if count else {}),
            **(extra_env or {}),
        }
        if not count:
            os.environ.pop("BENCH_STATS_URL", None)
        if not embedded:
            self.env["DATABASE_URL"] = f"{PG}/{db_name}"
            self.env["CELERY_BROKER_URL"] = f"{self.redis_base}/{redis_db}"
        for key in ("DATABASE_URL", "CELERY_BROKER_URL"):
            if embedded:
                os.environ.pop(key, None)
        os.environ.update(self.env)

    # where things run, for the output
    def describe(self) -> str:
        if self.embedded:
            return (f"embedded: SQLite {self.data_dir}/muster.sqlite3 + filesystem:// broker "
                    f"(query counters in {self.env.get('BENCH_STATS_URL', 'none: not counted')})")
        return f"PostgreSQL {PG}/{self.db_name} + Redis broker {self.env['CELERY_BROKER_URL']}"

    def redis(self):
        import redis

        return redis.Redis.from_url(f"{self.redis_base}/{self.redis_db}")

    def _pg_admin(self, sql: str, db: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(f"{PG}/{db}", autocommit=True) as conn:
            conn.execute(sql)

    def setup(self) -> None:
        if not self.embedded:
            self._pg_admin(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            self._pg_admin(f'CREATE DATABASE "{self.db_name}"')
        self.redis().flushdb()  # db 15 is the bench's own: broker queues and counters
        import django

        import muster  # noqa: F401 - the package builds the Celery app, which reads bench.settings

        django.setup()
        from django.core.management import call_command

        call_command("migrate", "--noinput", verbosity=0)

    def pg_stats(self) -> dict[str, int]:
        if self.embedded:
            return {}
        import psycopg

        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, tup_fetched "
                "FROM pg_stat_database WHERE datname = %s", (self.db_name,)).fetchone()
        return dict(zip(["xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted",
                         "tup_fetched"], row, strict=True))

    # --- processes -------------------------------------------------------------------------------
    def start(self, name: str, cmd: list[str], ready: str | None = None, timeout: float = 60,
              env: dict | None = None) -> subprocess.Popen:
        logf = open(self.data_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **self.env, **(env or {})}, stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True)
        proc._bench_log = logf  # type: ignore[attr-defined]
        self.procs[name] = proc
        if ready:
            deadline = time.time() + timeout
            while ready not in (self.data_dir / f"{name}.log").read_text(errors="replace"):
                if proc.poll() is not None or time.time() > deadline:
                    tail = (self.data_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{name} did not become ready:\n{tail}")
                time.sleep(0.1)
        return proc

    def start_worker(self, name: str = "worker", concurrency: int = 4, nice: int | None = None) -> subprocess.Popen:
        """`nice`: MUSTER_WORKER_NICE for this worker (None: whatever the environment says)."""
        return self.start(name, [sys.executable, "-m", "celery", "-A", "muster", "worker", "--loglevel=INFO",
                                 f"--concurrency={concurrency}", "--without-gossip", "--without-mingle",
                                 "--without-heartbeat", "-n", f"{name}-{self.id}@%h"], ready=" ready.",
                          env=None if nice is None else {"MUSTER_WORKER_NICE": str(nice)})

    def start_beat(self) -> subprocess.Popen:
        return self.start("beat", [sys.executable, "-m", "celery", "-A", "muster", "beat", "--loglevel=INFO",
                                   "--schedule", str(self.data_dir / "celerybeat-schedule")],
                          ready="beat: Starting")

    def start_web(self, workers: int | None = None, threads: int | None = None,
                  name: str = "web") -> tuple[subprocess.Popen, int]:
        # BENCH_WEB_WORKERS / BENCH_WEB_THREADS: another shape of gunicorn, to compare
        workers = workers or int(os.environ.get("BENCH_WEB_WORKERS", 2))
        threads = threads or int(os.environ.get("BENCH_WEB_THREADS", 4))
        port = free_port()
        proc = self.start(name, [str(Path(sys.executable).parent / "gunicorn"), "muster.wsgi:application",
                                  "-b", f"127.0.0.1:{port}", "-w", str(workers), "--threads", str(threads), "--preload",
                                  "--access-logfile", "-"], ready="Booting worker")
        import urllib.request

        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        return proc, port

    def stop(self, name: str, grace: float = 20) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # a process group leader gone, its group may linger (prefork children): end them by pid
        for pid in [p for p in marked_processes(self.id) if _pgid(p) == proc.pid]:
            _kill(pid)
        proc._bench_log.close()  # type: ignore[attr-defined]

    def teardown(self, keep_db: bool = False) -> list[int]:
        for name in list(self.procs):
            self.stop(name)
        leftovers = marked_processes(self.id)
        for pid in leftovers:
            _kill(pid)
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # noqa: BLE001
            pass
        if not self.embedded and not keep_db:
            try:
                self._pg_admin(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            except Exception as exc:  # noqa: BLE001
                self.log(f"could not drop {self.db_name}: {exc}")
        try:
            self.redis().flushdb()
        except Exception:  # noqa: BLE001
            pass
        shutil.rmtree(self.data_dir, ignore_errors=True)
        return leftovers


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def wait_until(predicate, timeout: float, every: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return None
