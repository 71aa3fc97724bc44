"""One look at a placed job's runner and what the engine does with it.

`look` asks a host's runner how it is (network I/O only, so the batch watcher runs many in
threads); `take_look` records what it found about the host; `watch_observed` acts on a started
job's state: `pulling -> running`, or the end the runner reports. advance_job
(engine/starting/advance.py) uses them for a job still starting, watch_running
(engine/running/watch.py) for the running ones.
"""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from backends.base import BackendError
from engine import health, log_copy, runner_status
from engine.running import readiness
from engine.starting import cluster, containers, ordering
from muster.claimable import Lease
from runs import usage
from runs.choices import JobReason, JobStatus, RunnerState
from runs.models import Job
from runs.transitions import end_job, move_job

# the statuses advance_job claims a job in; a job given back after a look is in one of them
WATCHED = (JobStatus.PROVISIONING, JobStatus.PULLING, JobStatus.RUNNING)
# the statuses of a job handed to its runner but not yet seen running: `pulling` with an image,
# `provisioning` without one (no image, nothing is pulled, and the job never says so)
STARTING = (JobStatus.PROVISIONING, JobStatus.PULLING)
RUNNER_END_STATES = {
    RunnerState.DONE: (JobReason.DONE_BY_RUNNER, ""),
    RunnerState.FAILED: (JobReason.CONTAINER_EXITED_WITH_ERROR, "the commands exited with status {exit_status}"),
    RunnerState.MAX_DURATION_EXCEEDED: (JobReason.MAX_DURATION_EXCEEDED, "max_duration reached"),
    RunnerState.TERMINATED: (JobReason.TERMINATED_BY_SERVER, "the runner stopped the job"),
}


def poll_interval() -> float:
    return float(settings.MUSTER["JOB_POLL_INTERVAL"])


def look(host, follow: log_copy.Follow | None = None) -> tuple[dict | None, Exception | None]:
    """Ask a host's runner how it is (starting its agent if it is not up): network I/O only, no
    database, so the batch watcher can run many of these in threads. With `follow`, then fetch the
    job's new log bytes on the same connection (runs/services/logs.py: readers are served from
    the server's copy this keeps, never from the host).

    Never raises: what went wrong comes back, for take_look to act on with the job it belongs to.
    """
    try:
        status = runner_status.read(host)  # one round trip in the common case: the agent is already up
        if not status.get("agent_alive"):
            host.ensure_agent()
            status = runner_status.read(host)
        if follow is not None:
            follow.fetch(host, status)  # after the status: a log never delays what the health check needs
        return status, None
    except Exception as exc:  # noqa: BLE001 - raised again by take_look, on the job's own step
        return None, exc
    finally:
        host.close()


def take_look(job: Job, status: dict | None, error: Exception | None, seen: set[int] | None = None,
              at=None) -> dict | None:
    """Record what a look at the job's host found (reachability, agent seen); the status or None.
    `seen`: a batch's reachable hosts to write together (health.mark_reachable); `at`: when the
    batch's answers came (one time for the batch, so its give-back writes one value, not a CASE
    over every job)."""
    if error is not None and not isinstance(error, BackendError):
        raise error
    if error is not None:
        health.mark_unreachable(job.instance, str(error))
        return None
    health.mark_reachable(job.instance, seen)
    if status.get("agent_alive"):
        job.agent_seen_at = at or timezone.now()  # saved when the lease is given back
    return status


def watch_observed(job: Job, status: dict | None, *, lease: Lease) -> None:
    """Act on one look at a started job's runner (None: the host did not answer); `lease`: the hold
    of the step that looked (advance_job, watch_running), which each move of the job takes."""
    if status is None or not status.get("agent_alive"):
        _maybe_unreachable(job, lease)
        return
    state = status.get("jobs", {}).get(job.runner_job_id)
    if state is None:
        if job.status == JobStatus.RUNNING:
            end_job(job, JobReason.EXECUTOR_ERROR, "the runner lost the job", lease=lease)
        return
    job.usage = usage.with_sample(job.usage, state.get("usage")) or job.usage  # given back by the watch
    times = {"start_time": state.get("start_time"), "end_time": state.get("end_time"),
             "exit_status": state.get("exit_status")}
    if job.status == JobStatus.PULLING:
        containers.show_pull_progress(job, state)
    if (state.get("state") in (RunnerState.RUNNING, *RUNNER_END_STATES) and job.status in STARTING
            and not containers.container_end(state)):
        # a group without probes is ready once it runs; with probes, once they pass (readiness.py)
        now = timezone.now()
        ready = {} if ordering.probes_of(job) else {"ready_at": now, "first_ready_at": now}
        move_job(job, JobStatus.RUNNING, start_time=times["start_time"], message="running", lease=lease, **ready)
        readiness.wake_waiting_peers(job)
    if state.get("state") in (RunnerState.RUNNING, *RUNNER_END_STATES) and job.status == JobStatus.RUNNING:
        # the last results too: a job whose probes passed and that ended between two looks was ready
        readiness.observe_probes(job, state, status.get("now"), ended=state.get("state") != RunnerState.RUNNING,
                                 lease=lease)
    if state.get("state") in RUNNER_END_STATES:
        reason, text = RUNNER_END_STATES[state["state"]]
        text = text.format(exit_status=state.get("exit_status"))
        if reason == JobReason.CONTAINER_EXITED_WITH_ERROR and not cluster.group_image(job):
            reason = JobReason.PROCESS_EXITED_WITH_ERROR
        reason, text = containers.container_end(state) or (reason, text)
        end_job(job, reason, text, lease=lease, **{k: v for k, v in times.items() if v is not None})


def _maybe_unreachable(job: Job, lease: Lease) -> None:
    instance = job.instance
    instance.refresh_from_db(fields=["unreachable", "unreachable_since"])
    since = instance.unreachable_since or job.agent_seen_at or job.status_changed_at
    if since and (timezone.now() - since).total_seconds() > settings.MUSTER["UNREACHABLE_GRACE"]:
        end_job(job, JobReason.INSTANCE_UNREACHABLE,
                f"{instance.name} has not answered for {settings.MUSTER['UNREACHABLE_GRACE']:.0f}s", lease=lease)
