"""Helpers for engine tests that run a real Celery worker against the test database."""

from __future__ import annotations

import time

from runs.models import Run


def wait_for_run(name: str, statuses=("done", "failed", "terminated"), timeout: float = 60.0,
                 project: str = "main") -> Run:
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
