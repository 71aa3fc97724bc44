"""Helpers for engine tests that run a real Celery worker against the test database."""

from __future__ import annotations

import time

from runs.models import Run
from tests.waiting import patient


def wait_for_run(name: str, statuses=("done", "failed", "terminated"), timeout: float = 60.0,
                 project: str = "main") -> Run:
    timeout = patient(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.filter(project__name=project, name=name).first()
        if run is not None and run.status in statuses:
            return run
        time.sleep(0.2)
    run = Run.objects.filter(project__name=project, name=name).first()
    jobs = [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in run.current_jobs()] if run else []
    raise AssertionError(f"run {name} did not reach {statuses} in {timeout}s: "
                         f"{run and run.status} {run and run.termination_reason} jobs={jobs}")


class Beat:
    """Stands in for celery beat during a test: runs the sweep every `interval` seconds in a thread.

    The celery_worker fixture already sends beat's other entry, the batch watch of running jobs;
    `watch=True` sends it here too, for tests whose workers are processes of their own.
    """

    def __init__(self, interval: float = 0.5, watch: bool = False):
        import threading

        self.interval = interval
        self.watch = watch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        from django.db import connection

        from engine import tasks
        from engine.sweeps import sweep

        try:
            while not self._stop.wait(self.interval):
                sweep()
                if self.watch:
                    tasks.watch_running.delay()
        finally:
            connection.close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def local_project_fleet(size: int = 4, name: str = "local"):
    from instances.services.fleets import create_local_fleet
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    return create_local_fleet(project, name, size, placement="cluster")


def job_summary(run) -> list[tuple]:
    return [(j.job_num, j.status, j.termination_reason) for j in run.current_jobs()]


def runner_processes(marker: str) -> list[int]:
    """Pids of live processes whose command line contains `marker` (zombies excluded)."""
    import os

    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            pids.append(int(entry))
    return pids
