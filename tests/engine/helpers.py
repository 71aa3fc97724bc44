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


class BackgroundLoop:
    """A thread that calls `tick()` every `interval` seconds while the `with` block runs, and closes
    its own database connection when it stops."""

    interval = 0.5

    def __init__(self):
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        from django.db import connection

        try:
            while not self._stop.wait(self.interval):
                self.tick()
        finally:
            connection.close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


class Beat(BackgroundLoop):
    """Stands in for celery beat during a test: runs the sweep every `interval` seconds in a thread.

    The celery_worker fixture already sends beat's other entry, the batch watch of running jobs;
    `watch=True` sends it here too, for tests whose workers are processes of their own.
    """

    def __init__(self, interval: float = 0.5, watch: bool = False):
        super().__init__()
        self.interval = interval
        self.watch = watch

    def tick(self) -> None:
        from engine import tasks
        from engine.sweeps import sweep

        sweep()
        if self.watch:
            tasks.watch_running.delay()


def worker_process(name: str, env: dict):
    """A Celery worker process of its own (prefork, 2 children) on the test's queue, in a new session."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "muster", "worker", "--pool", "prefork", "--concurrency", "2",
         "-Q", env["MUSTER_TEST_QUEUE"], "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
         "--loglevel", "WARNING"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def local_project_fleet(size: int = 4, name: str = "local"):
    from instances.services.fleets import create_local_fleet
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    return create_local_fleet(project, name, size, placement="cluster")


def job_summary(run) -> list[tuple]:
    return [(j.job_num, j.status, j.termination_reason) for j in run.current_jobs()]


def runner_processes(marker: str) -> list[int]:
    """Pids of live processes of this test's local hosts whose command line contains `marker`
    (zombies excluded). Only processes working under the test's LOCAL_DIR count: a suite running
    beside this one (another checkout, the same test at the same moment) starts processes with
    the same command lines."""
    import os

    from django.conf import settings

    root = os.path.realpath(settings.MUSTER["LOCAL_DIR"])
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
        if marker not in cmd or state == "Z":
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd == root or cwd.startswith(root + os.sep):
            pids.append(int(entry))
    return pids
