"""Watching running jobs in batches: one task looks at every running job that is due.

A job in `running` has nothing to do but be looked at until its runner reports an end. One task
per job per poll interval made the watch loop the control plane's main cost (a message, a claim
and a release for each look). Instead beat sends `watch_running` every JOB_POLL_INTERVAL: it
claims the due jobs WATCH_BATCH (engine/tuning.py) at a time (claim_batch, SKIP LOCKED on PostgreSQL, so several workers
share the work without waiting on each other), asks their runners in threads that only do network
I/O, acts on each answer on this task's connection, and gives the whole batch back in one UPDATE.
A job that ended is handed to finish_job as advance_job would; the ends one batch sees go
together, FINISH_BATCH jobs to a finish_jobs message (engine/messages.py `gathered`).

advance_job still drives the short stages before `running` (runner up, peers, start order).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from backends.base import BackendError
from backends.registry import compute_for_instance
from engine import claims, health, job_hosts, log_copy, messages
from engine.job_outcome import job_outcome
from engine.running import observe
from engine.tuning import GATHERED, WATCH_BATCH, WATCH_THREADS
from runs.choices import JobStatus
from runs.models import Job
from runs.transitions import end_job

log = logging.getLogger(__name__)


def watch_running() -> int:
    """Task body: look at every due running job, a batch at a time; returns how many were looked at.

    Stops after about one poll interval even if more are due, so a busy fleet is shared between
    the ticks (and the workers) instead of one task holding on to it.
    """
    started = time.monotonic()
    total = 0
    while True:
        n = _watch_batch()
        total += n
        if n < WATCH_BATCH or time.monotonic() - started > observe.poll_interval():
            return total


def _watch_batch() -> int:
    now = timezone.now()
    # never looked at (NULL): a worker that moved the job to running died before giving it back
    due = Job.objects.filter(Q(next_check_at__lte=now) | Q(next_check_at__isnull=True),
                             status=JobStatus.RUNNING, runner_submitted=True, instance__isnull=False)
    # the jobs a batch sees end go to finish_jobs a few messages at a time, not one message each
    with messages.gathered(GATHERED):
        return len(claims.claimed_batch(due, WATCH_BATCH, "watch_running", _watch).pks)


def _watch(held: claims.Held) -> dict[int, claims.Outcome]:
    jobs = job_hosts.with_fleets(list(held.rows(_WATCHED_ROWS)))
    follows = {job.pk: log_copy.follow(job) for job in jobs}
    looks = _look_at_all(jobs, held, follows)
    answered = timezone.now()
    seen_before = {job.pk: job.agent_seen_at for job in jobs}
    usage_before = {job.pk: job.usage for job in jobs}
    seen: set[int] = set()  # the hosts that answered, their last_seen written in one UPDATE
    for job in jobs:
        if job.pk not in looks:
            continue
        with held.row(job.pk):  # a bad answer or a bug backs off its own job, never the batch
            log_copy.take(job, follows[job.pk])
            try:
                observe.watch_observed(job, observe.take_look(job, *looks[job.pk], seen=seen, at=answered), lease=held.lease)
            except BackendError as exc:
                log.warning("job %s: backend error: %s", job, exc)
                end_job(job, exc.reason, str(exc), lease=held.lease)
    health.record_seen(seen)
    # Due again half an interval from now, so the next tick (one interval after this one began)
    # finds it due: a full interval would skip a tick and look at each job every other interval.
    next_at = timezone.now() + timedelta(seconds=observe.poll_interval() / 2)
    # every job of the batch goes back in one UPDATE (claims.give_back_batch), the ones whose
    # agent answered with agent_seen_at, the ones that ended with their finish_job sent after
    return {job.pk: job_outcome(job, next_check_at=next_at,
                                **({"agent_seen_at": job.agent_seen_at} if job.agent_seen_at != seen_before[job.pk]
                                   else {}),
                                **({"usage": job.usage} if job.usage is not usage_before[job.pk] else {}))
            for job in jobs if job.pk not in held.failed}


# not what the user wrote (up to the API's size cap), which a look never reads, nor the JSON of a
# run's restarts, rollout and scaling: each field read is a decode per job per look, and a batch is
# up to WATCH_BATCH jobs every JOB_POLL_INTERVAL (a look that needs one after all, a job ending,
# reads it then). The hosts' fleets and slices are read apart, once each (engine/job_hosts.py).
_WATCHED_ROWS = (Job.objects.select_related("run", "instance")
                 .defer("run__submitted_text", "run__restarts", "run__rollout", "run__scaling",
                        "run__desired_replicas", "run__termination_message", "termination_message"))


def _look_at_all(jobs: list[Job], held: claims.Held, follows: dict[int, log_copy.Follow | None]) -> dict[int, tuple]:
    # Hosts are made here, on this thread (they may read settings or decrypt keys); the threads
    # only talk to them. Every database write happens afterwards, on this task's connection.
    hosts = {}
    for job in jobs:
        with held.row(job.pk):
            hosts[job.pk] = compute_for_instance(job.instance).runner_host(job.instance)
    if len(hosts) == 1:
        return {pk: observe.look(host, follows[pk]) for pk, host in hosts.items()}
    answers = look_threads().map(lambda pk: observe.look(hosts[pk], follows[pk]), hosts)
    return dict(zip(hosts, answers, strict=True))


_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()
_pid = os.getpid  # the process the pool was made in


def as_answered(calls: dict) -> Iterator[tuple]:
    """(key, result) of each of `calls` (key: a function of no arguments that only does network
    I/O), run in the look threads, in the order they finish: a host that does not answer holds up
    its own row, not the ones that answered (the batch steps act on each answer as it comes)."""
    futures = {look_threads().submit(call): key for key, call in calls.items()}
    for future in as_completed(futures):
        yield futures[future], future.result()


def look_threads() -> ThreadPoolExecutor:
    """The process's look threads, kept between batches: a pool per batch started up to
    WATCH_THREADS threads several times a second on a busy fleet. Made in the process that uses it
    (a prefork child), never inherited from the parent across a fork, whose threads do not follow.
    Watch tasks running at once in one process (a pool of threads) share it."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != _pid():
            _pool = (_pid(), ThreadPoolExecutor(max_workers=WATCH_THREADS, thread_name_prefix="watch"))
        return _pool[1]
