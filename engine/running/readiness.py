"""When a running job is ready, from the probe results its runner reports with its status.

A job of a group without probes is ready once it runs (`ready_at` is set with the move to
`running`, observe.py). A job with probes is ready once every probe has passed its `ready_after`
times in a row (the runner counts the streaks, runner/probes.py); until then each look checks
its group's `ready_timeout`, counted on the host's own clock from the job's start (the runner's
`now` and `start_time`, so a skewed host clock cannot shorten or stretch it). Later failures are
shown with the job but are not failures (dstack's meaning of service probes). A service's replica
is probed for as long as it runs, and its readiness follows its probes both ways (_follow_replica).
"""

from __future__ import annotations

from functools import partial

from django.db import transaction
from django.utils import timezone

from engine import messages
from engine.job_outcome import learn
from engine.nudges import is_service
from engine.starting.ordering import group_conf, has_ordering, probes_of
from muster.claimable import Lease
from runs.choices import JobReason, JobStatus
from runs.configuration.readiness import Probe
from runs.configuration.stored import run_configuration
from runs.models import Job
from runs.transitions import end_job, move_job


def describe(probe: Probe) -> str:
    if probe.type == "exec":
        return "exec " + " ".join(probe.command or [])[:60]
    if probe.type == "tcp":
        return f"tcp :{probe.port}"
    return f"http {str(probe.method or 'get').upper()} :{probe.port}{probe.url or '/'}"


def observe_probes(job: Job, state: dict, host_now: float | None, ended: bool = False, *, lease: Lease) -> None:
    """Act on the probe results of one look at a running job (the caller holds its claim).
    `ended`: the runner says the job is over (the caller ends it next): its results still say
    whether it was ready, but no ready_timeout applies any more."""
    probes = probes_of(job)
    if not probes or job.status != JobStatus.RUNNING or (ended and job.ready_at is not None):
        # once ready, a job's end does not rewrite what its probes showed (a stop fails them last)
        return
    reported = state.get("probes") or []
    results = []
    for i, probe in enumerate(probes):
        got = reported[i] if i < len(reported) and isinstance(reported[i], dict) else {}
        results.append({
            "probe": describe(probe),
            "success_streak": got.get("success_streak", 0),
            "ready_after": probe.ready_after,
            "last_error": got.get("last_error"),
            "last_at": got.get("last_at"),
        })
    updates: dict = {}
    if results != job.probes:
        updates["probes"] = results
    passed = all(r["success_streak"] >= r["ready_after"] for r in results)
    if not ended and is_service(job.run):
        _follow_replica(job, state, host_now, results, passed, updates, lease)
        return
    if passed and job.ready_at is None:
        # written with the give-back; the peers look again once it is (they wait for this ready_at)
        learn(job, event=f"ready: {', '.join(r['probe'] for r in results)} passed",
              then=partial(wake_waiting_peers, job), ready_at=timezone.now(), **updates)
        return
    if updates:
        learn(job, **updates)
    if job.ready_at is None and not ended:
        _check_ready_timeout(job, state, host_now, results, lease)


def _follow_replica(job: Job, state: dict, host_now: float | None, results: list[dict], passed: bool, updates: dict,
                    lease: Lease) -> None:
    """A service's replica is probed as long as it runs: in the endpoint's pool while its probes
    pass, out of it at the first failure, back in once they pass again (each a move of the job
    whose transaction tells the endpoints, runs/transitions.py). A replica the engine is draining
    (drain_at) stays out. Its ready_timeout ends it only if it never was ready."""
    if updates:
        learn(job, **updates)
    if passed and job.ready_at is None and job.drain_at is None:
        now = timezone.now()
        again = " again" if job.first_ready_at else ""
        # drain (engine/replicas/rows.py) is process_run's, written without this job's lease: a drain
        # after our copy was read must keep the replica out of the pool
        move_job(job, JobStatus.RUNNING, frm=[JobStatus.RUNNING], lease=lease, where={"drain_at__isnull": True},
                 ready_at=now, first_ready_at=job.first_ready_at or now,
                 message=f"ready{again}: {', '.join(r['probe'] for r in results)} passed: in the endpoint's pool")
    elif not passed and job.ready_at is not None:
        failing = "; ".join(f"{r['probe']}: {r['last_error'] or 'failed'}" for r in results
                            if r["success_streak"] < r["ready_after"])
        move_job(job, JobStatus.RUNNING, frm=[JobStatus.RUNNING], lease=lease, ready_at=None,
                 message=f"not ready: {failing}"[:900] + ": out of the endpoint's pool until its probes pass")
    elif job.ready_at is None and job.first_ready_at is None:
        _check_ready_timeout(job, state, host_now, results, lease)


def _check_ready_timeout(job: Job, state: dict, host_now: float | None, results: list[dict], lease: Lease) -> None:
    limit = group_conf(job).ready_timeout
    start = state.get("start_time") or job.start_time
    if not limit or start is None or host_now is None or host_now - float(start) <= limit:
        return
    failing = [f"{r['probe']}: {r['last_error'] or 'no answer yet'} ({r['success_streak']}/{r['ready_after']})"
               for r in results if r["success_streak"] < r["ready_after"]]
    end_job(job, JobReason.WAITING_READY_LIMIT_EXCEEDED,
            f"not ready within ready_timeout {limit}s: " + "; ".join(failing)[:900], lease=lease)


def wake_waiting_peers(job: Job) -> None:
    """The jobs of the run still waiting to start look again now (one of them may wait for this one)."""
    if not has_ordering(run_configuration(job.run)):
        return  # peers wait for addresses only, and those were known before this job started
    with transaction.atomic():
        waiting = job.run.current_jobs().filter(status__in=(JobStatus.PROVISIONING, JobStatus.PULLING))
        for peer_id in waiting.values_list("pk", flat=True):
            messages.advance_job(peer_id)
