"""`muster serve` / `make run`: web, one Celery worker, Celery beat, the dstack CLI's SSH gateway
and the services endpoint (serving/proxy/) as child processes.

Ctrl-C (or SIGTERM) stops all three; a child that dies on its own is restarted. The worker and
beat are the same ones production runs separately (docker-compose.yml); here they share the
embedded SQLite + filesystem broker (muster/broker.py).

Quiet by default: the children's output goes to files under the data directory (serve-logs/) and
the terminal shows the banner, the supervisor's own lines, warnings and errors from those files,
and run state changes (muster/serve_console.py). `--verbose` sends the children's output to the
terminal as it comes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from muster.env import data_dir

WORKER_NICE = 10


def _manage(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", *args]


def web_command(bind: str, dev: bool = False) -> list[str]:
    """The web: gunicorn (as in production), or Django's development server with `--dev`.

    runserver is Django's development server, neither hardened nor tuned for many clients (it
    says so at every start); gunicorn's workers and threads come from the CPU count unless
    MUSTER_WEB_WORKERS / MUSTER_WEB_THREADS say otherwise; whitenoise serves the static files in both.
    """
    if dev:
        return _manage("runserver", bind, "--noreload", "--skip-checks")  # checked by the test suite
    from django.conf import settings

    workers = settings.MUSTER["WEB_WORKERS"] or min(4, max(2, os.cpu_count() or 1))
    return [sys.executable, "-m", "gunicorn", "muster.wsgi", "--bind", bind, "--workers", str(workers),
            "--threads", str(settings.MUSTER["WEB_THREADS"]), "--worker-class", "gthread",
            # the app and its warm-up (muster/warm.py) are loaded once, in the master, before the fork
            "--preload",
            # a request that holds a worker this long is a bug: gunicorn kills and replaces it
            "--timeout", "120", "--graceful-timeout", "10", "--access-logfile", "-"]


def commands(bind: str, concurrency: int, dev: bool = False) -> dict[str, list[str]]:
    celery = [sys.executable, "-m", "celery", "-A", "muster"]
    return {
        "web": web_command(bind, dev),
        "worker": [*celery, "worker", "--loglevel=INFO", f"--concurrency={concurrency}", "--without-gossip",
                   "--without-mingle"],
        "beat": [*celery, "beat", "--loglevel=WARNING", "--schedule",
                 str(data_dir() / "celerybeat-schedule")],
        # the SSH gateway the dstack CLI follows logs through (MUSTER_DSTACK_SSH_BIND, set by serve())
        "gateway": _manage("dstack_gateway"),
        # the services endpoint (MUSTER_ENDPOINT_BIND, set by serve()): /proxy/services/... streamed
        # to the replicas, asynchronous, so a long stream holds no web worker
        "endpoint": _manage("serve_endpoint"),
    }


def prepare(bootstrap: bool = True) -> None:
    """Migrate (when a migration is pending) and bootstrap in this process.

    Each used to be a Python process of its own, which cost a warm start two more interpreter and
    Django start-ups before the web even began; the children below start only after this.
    """
    import django
    from django.core.management import call_command
    from django.db import connection, connections
    from django.db.migrations.executor import MigrationExecutor

    django.setup()
    executor = MigrationExecutor(connection)
    if executor.migration_plan(executor.loader.graph.leaf_nodes()):
        call_command("migrate", "--noinput", verbosity=0)
    if bootstrap:
        call_command("muster_bootstrap")
    connections.close_all()  # the children open their own


# Started once the web answers (or after START_LATER_LIMIT): on 2 CPUs, four children importing
# Django at once each got a quarter of the machine, and the web, whose master now loads the whole
# app before its fork (--preload, muster/warm.py), answered last. Neither beat's first tick nor the
# dstack CLI's SSH gateway is needed for the first request or for the worker's first task.
START_LATER = ("beat", "gateway", "endpoint")
START_LATER_LIMIT = 10.0


def web_answers(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=0.5):
            return True
    except urllib.error.HTTPError:  # an answer all the same (a full disk's 503, a host not allowed)
        return True
    except OSError:  # not listening yet
        return False


RESTART_BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
# a child that stayed up this long has recovered: its next death starts the backoff over
STEADY_SECONDS = 60.0


def _say(text: str) -> None:
    print(f"muster serve: {text}", file=sys.stderr, flush=True)


def _how(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"status {code}"


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    # each child leads its own session: this reaches the worker's prefork children too, which
    # outlive a SIGKILLed worker and would otherwise keep taking messages nobody supervises
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Child:
    """One of web, worker, beat: started, watched, restarted with backoff when it dies."""

    def __init__(self, name: str, cmd: list[str], env: dict | None, output: Path | None = None):
        self.name, self.cmd, self.env, self.output = name, cmd, env, output
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.failures = 0  # deaths in a row without a steady spell between them
        self.restart_at: float | None = None

    def start(self) -> None:
        if self.output is None:
            self.proc = subprocess.Popen(self.cmd, start_new_session=True, env=self.env)
        else:
            # appended across restarts, so the lines before a death stay next to those after it
            with self.output.open("ab") as out:
                self.proc = subprocess.Popen(self.cmd, start_new_session=True, env=self.env, stdin=subprocess.DEVNULL,
                                             stdout=out, stderr=subprocess.STDOUT)
        self.started = time.monotonic()
        self.restart_at = None

    def check(self, now: float) -> None:
        if self.proc is None:  # not started yet (START_LATER)
            return
        if self.restart_at is not None:
            if now >= self.restart_at:
                self.start()
                _say(f"{self.name} restarted (pid {self.proc.pid}, restart {self.failures})")
            return
        code = self.proc.poll()
        if code is None:
            return
        _kill_group(self.proc, signal.SIGKILL)
        if now - self.started >= STEADY_SECONDS:
            self.failures = 0
        delay = RESTART_BACKOFF[min(self.failures, len(RESTART_BACKOFF) - 1)]
        self.failures += 1
        self.restart_at = now + delay
        _say(f"{self.name} (pid {self.proc.pid}) exited with {_how(code)}; restarting it in {delay:g}s")

    def stop(self) -> None:
        # to the child alone, not its group: the Celery worker's warm shutdown lets its pool
        # processes finish and stops them itself, while a SIGTERM that reaches them as well kills
        # them under it and its shutdown then waits for them until it is killed (gunicorn's master
        # likewise stops its own workers)
        if self.proc is not None and self.restart_at is None and self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait(self, deadline: float) -> None:
        if self.proc is None or self.restart_at is not None:
            return
        try:
            code = self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            _say(f"{self.name} stopped ({_how(code)})")
        except subprocess.TimeoutExpired:
            _say(f"{self.name} (pid {self.proc.pid}) did not stop in time; killing it")
        _kill_group(self.proc, signal.SIGKILL)  # whatever of its group is left


def gateway_bind(web_host: str, port: int | None = None) -> str:
    """Where the dstack CLI's SSH gateway listens: on the web's host (`make run BIND=0.0.0.0:8000`
    serves both to other machines), at MUSTER_DSTACK_SSH_PORT (2222); an operator's
    MUSTER_DSTACK_SSH_BIND names both instead, and `--gateway-port` wins over either port."""
    from django.conf import settings

    given = os.environ.get("MUSTER_DSTACK_SSH_BIND", "")
    host, _, given_port = given.rpartition(":") if given else (web_host, "", "")
    return f"{host}:{port or given_port or settings.MUSTER['DSTACK_SSH_PORT']}"


def _reachable(host: str) -> str:
    # a wildcard bind is reached through any of the machine's addresses; this one always works here
    return "127.0.0.1" if host in ("", "0.0.0.0", "[::]") else host


def endpoint_bind(web_host: str) -> str:
    """Where the services endpoint listens: on the web's host at MUSTER_ENDPOINT_BIND's port (8001),
    unless MUSTER_ENDPOINT_BIND was given, which names both."""
    from django.conf import settings

    given = os.environ.get("MUSTER_ENDPOINT_BIND", "")
    return given or f"{web_host}:{settings.MUSTER['ENDPOINT_BIND'].rpartition(':')[2]}"


def serve(bind: str = "127.0.0.1:8000", concurrency: int = 2, bootstrap: bool = True, verbose: bool = False,
          dev: bool = False, gateway_port: int | None = None) -> int:
    """Start web, worker and beat and keep them running until SIGINT (exit status 130) or SIGTERM (0).

    A child that dies is restarted after a backoff (1 s doubling to 30 s, back to 1 s once it has
    run for a minute), with a line on stderr for the death and one for the restart. The others
    keep running meanwhile: a dead worker does not take the web down with it.
    """
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "muster.settings")
    prepare(bootstrap)
    from django.conf import settings

    host, _, port = bind.rpartition(":")
    # in the environment, so the web (which tells the CLI where to dial) and the gateway agree
    os.environ["MUSTER_DSTACK_SSH_BIND"] = gateway_bind(host, gateway_port)
    # likewise for the endpoint and the web, which redirects /proxy/services/... to it: services'
    # URLs name where it listens unless the operator named a public URL (a TLS proxy's)
    os.environ["MUSTER_ENDPOINT_BIND"] = endpoint_bind(host)
    endpoint_host, _, endpoint_port = os.environ["MUSTER_ENDPOINT_BIND"].rpartition(":")
    os.environ.setdefault("MUSTER_ENDPOINT_URL", f"http://{_reachable(endpoint_host)}:{endpoint_port}")
    url = f"http://{_reachable(host)}:{port}"
    print(f"Muster: console {url}/  API {url}/api/  docs {url}/api/docs/  admin {url}/admin/  "
          f"services {os.environ['MUSTER_ENDPOINT_URL'].rstrip('/')}/proxy/services/", flush=True)
    logs: dict[str, Path] = {}
    if not verbose:
        log_dir = Path(settings.DATA_DIR) / "serve-logs"
        log_dir.mkdir(mode=0o700, exist_ok=True)
        logs = {name: log_dir / f"{name}.log" for name in ("web", "worker", "beat", "gateway", "endpoint")}
        print(f"logs: web, worker and beat write to {log_dir}/; here: warnings and run state changes "
              "(--verbose shows everything)", flush=True)
    # web, worker and beat share this machine: the worker gives way to the web (muster/celery.py)
    worker_env = {**os.environ, "MUSTER_WORKER_NICE": os.environ.get("MUSTER_WORKER_NICE", str(WORKER_NICE))}
    children = [Child(name, cmd, worker_env if name == "worker" else None, logs.get(name))
                for name, cmd in commands(bind, concurrency, dev).items()]
    console = None
    if logs:
        from muster.serve_console import Console

        console = Console(logs)
    stopping = 0

    def stop(signum, _frame):
        nonlocal stopping
        if not stopping:
            # at once, and by os.write: a print here could land inside the loop's own print
            os.write(2, f"muster serve: stopping {', '.join(c.name for c in children)}...\n".encode())
        stopping = signum

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    later = [child for child in children if child.name in START_LATER]
    for child in children:
        if child not in later:
            child.start()
    start_later_by = time.monotonic() + START_LATER_LIMIT
    while not stopping:
        now = time.monotonic()
        if later and (now >= start_later_by or web_answers(url)):
            for child in later:
                child.start()
            later = []
        for child in children:
            child.check(now)
        if console is not None:
            console.tick()
        time.sleep(0.1 if later else 0.5)
    for child in children:
        child.stop()
    deadline = time.monotonic() + 10
    for child in children:
        child.wait(deadline)
    _stop_local_agents()
    return 130 if stopping == signal.SIGINT else 0  # Ctrl-C: the shell's status for an interrupted command


def _stop_local_agents() -> None:
    """Local instances live only while Muster serves: ask their runner agents to exit too."""
    for home in data_dir().glob("local/*/muster"):
        (home / "agent.stop").touch()
