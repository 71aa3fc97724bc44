"""`muster serve` / `make run`: web, one Celery worker and Celery beat as child processes.

Ctrl-C (or SIGTERM) stops all three. The worker and beat are the same ones production runs
separately (docker-compose.yml); here they share the embedded SQLite + filesystem broker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

WORKER_NICE = 10


def _manage(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", *args]


def commands(bind: str, concurrency: int) -> dict[str, list[str]]:
    celery = [sys.executable, "-m", "celery", "-A", "muster"]
    return {
        "web": _manage("runserver", bind, "--noreload", "--skip-checks"),  # checked by the test suite
        "worker": [*celery, "worker", "--loglevel=INFO", f"--concurrency={concurrency}", "--without-gossip",
                   "--without-mingle"],
        "beat": [*celery, "beat", "--loglevel=WARNING", "--schedule",
                 os.path.join(os.environ.get("MUSTER_DATA_DIR", ".muster-data"), "celerybeat-schedule")],
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


def serve(bind: str = "127.0.0.1:8000", concurrency: int = 2, bootstrap: bool = True) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "muster.settings")
    prepare(bootstrap)
    print(f"Muster: API http://{bind}/api/  docs http://{bind}/api/docs/  admin http://{bind}/admin/", flush=True)
    # web, worker and beat share this machine: the worker gives way to the web (muster/celery.py)
    worker_env = {**os.environ, "MUSTER_WORKER_NICE": os.environ.get("MUSTER_WORKER_NICE", str(WORKER_NICE))}
    children = {name: subprocess.Popen(cmd, start_new_session=True, env=worker_env if name == "worker" else None)
                for name, cmd in commands(bind, concurrency).items()}
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = 0
    while not stopping:
        for name, proc in children.items():
            if proc.poll() is not None:
                print(f"muster serve: {name} exited with {proc.returncode}; stopping", file=sys.stderr)
                stopping, code = True, 1
        time.sleep(0.5)
    for proc in children.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + 10
    for proc in children.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    _stop_local_agents()
    return code


def _stop_local_agents() -> None:
    """Local instances live only while Muster serves: ask their runner agents to exit too."""
    from pathlib import Path

    data = Path(os.environ.get("MUSTER_DATA_DIR", ".muster-data"))
    for home in data.glob("local/*/muster"):
        (home / "agent.stop").touch()
