"""How long a job's stop may take: dstack's `stop_duration`, the seconds between the stop signal
(SIGTERM, `docker stop`) and the kill. The runner is given it in the job's spec (`stop_grace`);
finish_job waits that long, and a little more, before it gives the host back regardless.

dstack's default is five minutes (profiles.DEFAULT_STOP_DURATION in 0.22.5); `off` (no limit in
dstack) and anything longer are held to MAX_STOP_DURATION, so a job that ignores its stop signal
cannot hold a host for ever.
"""

from __future__ import annotations

from runs.configuration.stored import run_configuration
from runs.models import Run

DEFAULT_STOP_DURATION = 300  # seconds, dstack's
MAX_STOP_DURATION = 3600  # seconds: an hour at most, `off` included
# seconds finish_job waits past the grace for the runner to say the job ended (its kill, the log copy)
STOP_SLACK = 30


def stop_grace(run: Run) -> int:
    """The run's stop grace in seconds (its `stop_duration`: -1 is `off`, None not written)."""
    written = run_configuration(run).profile.get("stop_duration")
    if written is None:
        return DEFAULT_STOP_DURATION
    if written < 0:
        return MAX_STOP_DURATION
    return min(int(written), MAX_STOP_DURATION)


def gives_up_after(run: Run) -> float:
    """Seconds after a job's stop began when finish_job hands its host back though the runner still
    says it runs (an unreachable runner, a kill that did not take): past the grace, at least a minute."""
    return max(60.0, stop_grace(run) + STOP_SLACK)
