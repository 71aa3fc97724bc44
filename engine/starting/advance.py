"""Moving a placed job forward: runner up, peers known, start order, then watching it run.

`advance_job` is the body of one idempotent task. It claims the job, looks once at the runner
(one round trip), takes at most one step, and schedules its next look. Each waiting stage has
its own clock, measured from when the job entered that stage.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backends.base import BackendError
from backends.registry import compute_for_instance
from engine import claims, health, messages, runner_status
from engine.starting import cluster, containers
from instances.models import InstanceStatus
from muster import crypto
from runs.choices import JobReason, JobStatus, RunnerState
from runs.models import Job
from runs.transitions import move_job, release_job, terminate_job

log = logging.getLogger(__name__)
WATCHED = (JobStatus.PROVISIONING, JobStatus.PULLING, JobStatus.RUNNING)
RUNNER_END_STATES = {
    RunnerState.DONE: (JobReason.DONE_BY_RUNNER, ""),
    RunnerState.FAILED: (JobReason.CONTAINER_EXITED_WITH_ERROR, "the commands exited with status {exit_status}"),
    RunnerState.MAX_DURATION_EXCEEDED: (JobReason.MAX_DURATION_EXCEEDED, "max_duration reached"),
    RunnerState.TERMINATED: (JobReason.TERMINATED_BY_SERVER, "the runner stopped the job"),
}


def limit(name: str) -> float:
    return float(settings.MUSTER[name])


def poll_interval() -> float:
    return float(settings.MUSTER.get("JOB_POLL_INTERVAL", 1.0))


def waited(job: Job) -> float:
    return (timezone.now() - job.status_changed_at).total_seconds()


def advance_job(job_id: int) -> bool:
    with claims.claimed(Job, job_id, "advance_job", status__in=WATCHED) as held:
        if held is None:
            return False
        job = Job.objects.select_related("run", "instance", "instance__fleet", "instance__group").get(pk=job_id)
        seen_before = job.agent_seen_at
        try:
            _step(job)
        except BackendError as exc:
            log.warning("job %s: backend error: %s", job, exc)
            terminate_job(job, exc.reason, str(exc), held=True)
        now = timezone.now()
        # A job that just started is due at the watcher's next tick: a short job (a router that
        # exits after one request) then ends within a tick instead of after one more interval.
        started = job.status == JobStatus.RUNNING and job.runner_submitted
        again = next_look(job)
        updates = {"next_check_at": now if started else now + timedelta(seconds=again)}
        if job.agent_seen_at != seen_before:
            updates["agent_seen_at"] = job.agent_seen_at  # written with the release, not on its own
        status = release_job(job, held.token, WATCHED, **updates)
    if held.failed:
        return True  # due again after the backoff (the sweep sends it)
    if status in WATCHED and not (status == JobStatus.RUNNING and job.runner_submitted):
        messages.start_job(job_id, countdown=again)  # outside a transaction: sent at once
    # a started job is looked at by the batch watcher from now on (engine/running/watch.py)
    return True


# A runner that accepted a job starts it within one agent poll (0.2 s) plus a process start, so a
# submitted job is looked at again this soon rather than a whole poll interval later.
STARTING_RECHECK = 0.25


def next_look(job: Job) -> float:
    """Seconds until advance_job looks at this job again."""
    if job.status == JobStatus.PULLING and job.runner_submitted:
        return min(STARTING_RECHECK, poll_interval())
    return poll_interval()


def end_held(job: Job, reason: str, message: str = "", **fields) -> None:
    """End the job this task holds; advance_job hands it to finish_job when it lets go."""
    terminate_job(job, reason, message, held=True, **fields)


def _step(job: Job) -> None:
    if job.status == JobStatus.PROVISIONING:
        _wait_for_runner(job)
    elif job.status == JobStatus.PULLING:
        _start_when_ready(job)
    elif job.status == JobStatus.RUNNING:
        _watch(job)


def look(host) -> tuple[dict | None, Exception | None]:
    """Ask a host's runner how it is (starting its agent if it is not up): network I/O only, no
    database, so the batch watcher can run many of these in threads.

    Never raises: what went wrong comes back, for take_look to act on with the job it belongs to.
    """
    try:
        status = runner_status.read(host)  # one round trip in the common case: the agent is already up
        if not status.get("agent_alive"):
            host.ensure_agent()
            status = runner_status.read(host)
        return status, None
    except Exception as exc:  # noqa: BLE001 - raised again by take_look, on the job's own step
        return None, exc
    finally:
        host.close()


def take_look(job: Job, status: dict | None, error: Exception | None) -> dict | None:
    """Record what a look at the job's host found (reachability, agent seen); the status or None."""
    if error is not None and not isinstance(error, BackendError):
        raise error
    if error is not None:
        health.mark_unreachable(job.instance, str(error))
        return None
    health.mark_reachable(job.instance)
    if status.get("agent_alive"):
        job.agent_seen_at = timezone.now()  # saved when the lease is given back
    return status


def _observe(job: Job) -> dict | None:
    """One round trip to the host's runner; None when the host cannot be reached."""
    return take_look(job, *look(compute_for_instance(job.instance).runner_host(job.instance)))


def _wait_for_runner(job: Job) -> None:
    instance = job.instance
    if instance is None or instance.status != InstanceStatus.BUSY or not instance.internal_ip:
        if waited(job) > limit("WAITING_INSTANCE_LIMIT"):
            end_held(job, JobReason.WAITING_INSTANCE_LIMIT_EXCEEDED, "the instance never became ready")
        return
    status = _observe(job)
    if status and status.get("agent_alive"):
        if move_job(job, JobStatus.PULLING, message=f"runner up on {instance.name}; waiting for peers"):
            _start_when_ready(job)  # peers are often known already: no reason to wait a poll
    elif waited(job) > limit("WAITING_RUNNER_LIMIT"):
        end_held(job, JobReason.WAITING_RUNNER_LIMIT_EXCEEDED,
                      f"the runner on {instance.name} did not come up within {limit('WAITING_RUNNER_LIMIT'):.0f}s")


def _started(job: Job) -> bool:
    # A peer that already finished has started too (a short master must not block its workers).
    return job.start_time is not None or job.status in (JobStatus.RUNNING, JobStatus.DONE)


def _order_allows(job: Job, jobs: list[Job]) -> bool:
    order = job.run.configuration.get("startup_order") or "any"
    if order == "master-first" and job.job_num != 0:
        return _started(jobs[0])
    if order == "workers-first" and job.job_num == 0:
        return all(_started(j) for j in jobs[1:])
    return True


def _start_when_ready(job: Job) -> None:
    jobs = list(job.run.current_jobs().select_related("instance", "instance__group"))
    if not job.runner_submitted:
        ready = cluster.all_ips_known(jobs) and _order_allows(job, jobs)
        if not ready:
            if waited(job) > limit("WAITING_PEERS_LIMIT"):
                end_held(job, JobReason.WAITING_PEERS_LIMIT_EXCEEDED,
                              "peers' addresses or start order not satisfied in time")
            return
        try:
            spec = cluster.runner_spec(job, jobs)
            host = compute_for_instance(job.instance).runner_host(job.instance)
        except crypto.DecryptError as exc:
            # the server's keys no longer open this run's secret env or the host's SSH key:
            # retrying cannot help, and the message says what to set again
            end_held(job, JobReason.EXECUTOR_ERROR, str(exc))
            return
        try:
            host.submit(job.runner_job_id, spec)
        finally:
            host.close()
        Job.objects.filter(pk=job.pk).update(runner_submitted=True)
        job.runner_submitted = True
    _watch(job)


def _watch(job: Job) -> None:
    watch_observed(job, _observe(job))


def watch_observed(job: Job, status: dict | None) -> None:
    """Act on one look at a started job's runner (None: the host did not answer)."""
    if status is None or not status.get("agent_alive"):
        _maybe_unreachable(job)
        return
    state = status.get("jobs", {}).get(job.runner_job_id)
    if state is None:
        if job.status == JobStatus.RUNNING:
            end_held(job, JobReason.EXECUTOR_ERROR, "the runner lost the job")
        return
    times = {"start_time": state.get("start_time"), "end_time": state.get("end_time"),
             "exit_status": state.get("exit_status")}
    if job.status == JobStatus.PULLING:
        containers.show_pull_progress(job, state)
    if (state.get("state") in (RunnerState.RUNNING, *RUNNER_END_STATES) and job.status == JobStatus.PULLING
            and not containers.container_end(state)):
        move_job(job, JobStatus.RUNNING, start_time=times["start_time"], message="running")
        _wake_waiting_peers(job)
    if state.get("state") in RUNNER_END_STATES:
        reason, text = RUNNER_END_STATES[state["state"]]
        text = text.format(exit_status=state.get("exit_status"))
        reason, text = containers.container_end(state) or (reason, text)
        end_held(job, reason, text, **{k: v for k, v in times.items() if v is not None})


def _wake_waiting_peers(job: Job) -> None:
    if (job.run.configuration.get("startup_order") or "any") == "any":
        return  # peers wait for addresses only, and those were known before this job started
    with transaction.atomic():
        for peer_id in job.run.current_jobs().filter(status=JobStatus.PULLING).values_list("pk", flat=True):
            messages.start_job(peer_id)


def _maybe_unreachable(job: Job) -> None:
    instance = job.instance
    instance.refresh_from_db(fields=["unreachable", "unreachable_since"])
    since = instance.unreachable_since or job.agent_seen_at or job.status_changed_at
    if since and (timezone.now() - since).total_seconds() > limit("UNREACHABLE_GRACE"):
        end_held(job, JobReason.INSTANCE_UNREACHABLE,
                      f"{instance.name} has not answered for {limit('UNREACHABLE_GRACE'):.0f}s")
