"""What a run waiting for a free host shows (the API, `muster ps`, the console's runs list): that it
waits, for what, and when it gives up. The wait itself is the engine's (engine/submitted/waiting.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from runs.choices import WAITING_FOR_HOST, JobStatus, RunStatus
from runs.configuration.stored import run_configuration
from runs.limits import retry_duration

PREFIX = WAITING_FOR_HOST  # how a job 0 that waits for a host starts its `waiting_for`


def gives_up_at(run) -> datetime | None:
    """When a run that may wait for capacity stops waiting: its submission plus `retry.duration`,
    counted as dstack counts no-capacity (None: past the calendar's end, it waits as long as it takes)."""
    try:
        return run.submitted_at + timedelta(seconds=retry_duration(run_configuration(run)))
    except OverflowError:
        return None


def waits_for_host(job) -> bool:
    return job.status == JobStatus.SUBMITTED and not job.superseded and job.waiting_for.startswith(PREFIX)


def waiting_view(run, jobs) -> dict:
    """{"waiting_for": what its job 0 waits for, "gives_up_at": datetime or None} while the run waits
    for a free host; {} otherwise. `jobs`: the run's current jobs as the caller read them."""
    if run.status != RunStatus.SUBMITTED:
        return {}
    waiting = next((j for j in jobs if waits_for_host(j)), None)
    if waiting is None:
        return {}
    return {"waiting_for": waiting.waiting_for, "gives_up_at": gives_up_at(run)}
