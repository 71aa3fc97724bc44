"""Moving a placed job forward: runner up, peers known, start order, then the hand-off to its runner.

`advance_job` is the body of one idempotent task. It claims the job, looks once at the runner
(one round trip), takes at most one step, and schedules its next look. Each waiting stage has
its own clock, measured from when the job entered that stage. What a look at the runner finds is
acted on by engine/running/observe.py, which the batch watcher of running jobs shares.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.utils import timezone

from backends.base import BackendError
from backends.registry import compute_for_instance
from engine import claims, job_hosts, log_copy, messages
from engine.job_outcome import job_outcome, learn
from engine.running import observe, watch
from engine.slice_replace import waits_for_replacement
from engine.starting import cluster, ordering
from engine.tuning import GATHERED, STARTING_RECHECK
from instances.models import InstanceStatus
from instances.queued import waits_in_queue
from muster import compiled, crypto
from muster.claimable import Lease
from runs.choices import JobReason, JobStatus
from runs.models import Job
from runs.transitions import end_job, move_job

log = logging.getLogger(__name__)


def waited(job: Job) -> float:
    return (timezone.now() - job.status_changed_at).total_seconds()


# The reads of every step, compiled once (muster/compiled.py): building and compiling them was a
# third of a job's CPU in the worker.
_JOB = compiled.Select(lambda pk: Job.objects.select_related(
    "run", "instance", "instance__fleet", "instance__group").filter(pk=pk), int)
_PEERS = compiled.Select(lambda run_id: Job.objects.select_related("instance", "instance__group").filter(
    run_id=run_id, superseded=False).order_by("job_num"), int)  # Run.current_jobs


# a batch's jobs (advance_jobs): the hosts' fleets and slices are read once for the batch
# (engine/job_hosts.py), not joined to each job (an SSH fleet's row lists every host)
_BATCH_ROWS = Job.objects.select_related("run", "instance")


def advance_job(job_id: int) -> bool:
    return claims.claimed(Job, job_id, "advance_job", _advance, status__in=observe.WATCHED) is not None


def advance_jobs(job_ids: list[int]) -> set[int]:
    """advance_job for several jobs in one claimed step (the starts one step asks for together: the
    runs a look placed, a gang, the peers a watch batch woke; engine/messages.py `gathered`):
    claimed and read together, their first looks at their runners made at once in threads, then
    each advanced as advance_job would as soon as its answer comes (an error backs off that job
    alone; a host that does not answer holds up no other job) and given back at once. Returns the
    ids this step held."""
    due = Job.objects.filter(pk__in=job_ids, status__in=observe.WATCHED)
    with messages.gathered(GATHERED):
        held = claims.claimed_batch(due, len(job_ids), "advance_jobs", _advance_each)
    return set(held.pks)


def _advance_each(held: claims.Held) -> dict[int, claims.Outcome]:
    jobs = {j.pk: j for j in job_hosts.with_fleets(list(held.rows(_BATCH_ROWS)))}
    looks = _first_looks(list(jobs.values()))
    for pk in sorted(set(jobs) - set(looks)):  # nothing to wait for first
        _advance_now(held, jobs[pk], None)
    for pk, found in watch.as_answered(looks):
        _advance_now(held, jobs[pk], found)
    return {}


def _advance_now(held: claims.Held, job: Job, looked: tuple | None) -> None:
    with held.row(job.pk):
        held.give_back_now(job.pk, _advance_one(job, held.lease, looked))


def _first_looks(jobs: list[Job]) -> dict[int, Callable[[], tuple]]:
    """The look each job's step makes first, to be made at once in the watch's threads (network
    I/O only): {job id: a call that returns (its log follow, the look's answer)}. Only for a job
    whose step looks before it writes anything (one handed to its runner, or one whose host is up
    and waits for its runner), and only for two or more; the hosts are made on this thread, as
    the watch makes them (one that cannot be made is left to the job's own step, which meets
    the same error as advance_job would)."""
    calls = {}
    for job in sorted(jobs, key=lambda j: j.pk):
        if not _looks_first(job):
            continue
        try:
            follow = log_copy.follow(job)
            host = compute_for_instance(job.instance).runner_host(job.instance)
        except Exception:  # noqa: BLE001 - raised again on the job's own row, by its own step
            continue
        calls[job.pk] = partial(_look, host, follow)
    if len(calls) < 2:
        for call in calls.values():
            call.args[0].close()  # one look gains nothing from a thread: the step makes it itself
        return {}
    return calls


def _look(host, follow) -> tuple:
    return follow, observe.look(host, follow)


def _looks_first(job: Job) -> bool:
    if job.runner_submitted:
        return job.status in observe.WATCHED
    instance = job.instance
    return (job.status == JobStatus.PROVISIONING and instance is not None and instance.status == InstanceStatus.BUSY
            and bool(instance.internal_ip))


def _advance(held: claims.Held) -> claims.Outcome:
    return _advance_one(_JOB.get(held.pk), held.lease)


def _advance_one(job: Job, lease: Lease, looked: tuple | None = None) -> claims.Outcome:
    """One held job's advance; `looked`: its first look, made already (_first_looks)."""
    seen_before = job.agent_seen_at
    try:
        _step(job, lease, looked)
    except BackendError as exc:
        log.warning("job %s: backend error: %s", job, exc)
        end_job(job, exc.reason, str(exc), lease=lease)
    now = timezone.now()
    # A job that just started is due at the watcher's next tick: a short job (a router that
    # exits after one request) then ends within a tick instead of after one more interval, and is
    # looked at by the batch watcher from now on (engine/running/watch.py), not by this step.
    started = job.status == JobStatus.RUNNING and job.runner_submitted
    again = next_look(job)
    updates = {"next_check_at": now if started else now + timedelta(seconds=again)}
    if job.agent_seen_at != seen_before:
        updates["agent_seen_at"] = job.agent_seen_at  # written with the give-back, not on its own
    then = (partial(messages.advance_job, job.pk, countdown=again),) if job.status in observe.WATCHED and not started \
        else ()
    return job_outcome(job, then, **updates)


def next_look(job: Job) -> float:
    """Seconds until advance_job looks at this job again."""
    if job.status in observe.STARTING and job.runner_submitted:
        return min(STARTING_RECHECK, observe.poll_interval())
    return observe.poll_interval()


def _step(job: Job, lease: Lease, looked: tuple | None = None) -> None:
    """`lease`: advance_job's hold on the job, which each of its moves takes; `looked`: the step's
    first look at the runner, made already (a batch's, made in threads)."""
    if job.status == JobStatus.PROVISIONING and job.runner_submitted:
        _watch(job, lease, looked)  # a job without an image, handed to its runner: it runs next
    elif job.status == JobStatus.PROVISIONING:
        _wait_for_runner(job, lease, looked)
    elif job.status == JobStatus.PULLING and job.runner_submitted:
        _watch(job, lease, looked)  # as _start_when_ready would, with nothing left to hand off
    elif job.status == JobStatus.PULLING:
        _start_when_ready(job, lease)
    elif job.status == JobStatus.RUNNING:
        _watch(job, lease, looked)


def _observe(job: Job, looked: tuple | None = None) -> dict | None:
    """One round trip to the host's runner (and its new log bytes); None when the host cannot be
    reached. `looked`: (the log follow, the answer) of a look made already."""
    if looked is None:
        follow = log_copy.follow(job)
        looked = (follow, observe.look(compute_for_instance(job.instance).runner_host(job.instance), follow))
    follow, found = looked
    log_copy.take(job, follow)
    return observe.take_look(job, *found)


def _wait_for_runner(job: Job, lease: Lease, looked: tuple | None = None) -> None:
    instance = job.instance
    if instance is None or instance.status != InstanceStatus.BUSY or not instance.internal_ip:
        # A host of a queued TPU request waits at Google for as long as the request may: the pod's
        # own poll bounds that wait (valid_until, then the limit from ACTIVE), not this one.
        if waited(job) > settings.MUSTER["WAITING_INSTANCE_LIMIT"] and not waits_in_queue(instance):
            end_job(job, JobReason.WAITING_INSTANCE_LIMIT_EXCEEDED, "the instance never became ready", lease=lease)
        return
    status = _observe(job, looked)
    if status and status.get("agent_alive"):
        if not cluster.group_image(job):
            # Nothing to pull: the job stays `provisioning` until its processes run, and waits for
            # its peers on the peers' clock, counted from when it began provisioning.
            _start_when_ready(job, lease)
        elif move_job(job, JobStatus.PULLING, message=f"runner up on {instance.name}; waiting for peers", lease=lease):
            _start_when_ready(job, lease)  # peers are often known already: no reason to wait a poll
    elif waited(job) > settings.MUSTER["WAITING_RUNNER_LIMIT"]:
        end_job(job, JobReason.WAITING_RUNNER_LIMIT_EXCEEDED,
                f"the runner on {instance.name} did not come up within {settings.MUSTER['WAITING_RUNNER_LIMIT']:.0f}s",
                lease=lease)


def _start_when_ready(job: Job, lease: Lease) -> None:
    jobs = cluster.replica_of(job, _PEERS.all(job.run_id))
    for peer in jobs:
        peer.run = job.run  # as run.jobs would: one run object, not a read per peer
    if not job.runner_submitted:
        waits = ordering.ADDRESSES if not cluster.all_ips_known(jobs) else ordering.waits_for(job, jobs)
        ordering.note_wait(job, waits)
        if waits:
            if waited(job) > settings.MUSTER["WAITING_PEERS_LIMIT"] and not waits_for_replacement(jobs):
                end_job(job, JobReason.WAITING_PEERS_LIMIT_EXCEEDED,
                        f"waited {settings.MUSTER['WAITING_PEERS_LIMIT']:.0f}s for {waits}", lease=lease)
            return
        try:
            spec = cluster.runner_spec(job, jobs)
            host = compute_for_instance(job.instance).runner_host(job.instance)
        except crypto.DecryptError as exc:
            # the server's keys no longer open this run's secret env or the host's SSH key:
            # retrying cannot help, and the message says what to set again
            end_job(job, JobReason.EXECUTOR_ERROR, str(exc), lease=lease)
            return
        try:
            host.submit(job.runner_job_id, spec)
        finally:
            host.close()
        # with the give-back: a step that fails after this submits again, which the runner takes
        # as the same job (its spec's digest decides, runner/commands.py)
        learn(job, runner_submitted=True)
    _watch(job, lease)


def _watch(job: Job, lease: Lease, looked: tuple | None = None) -> None:
    observe.watch_observed(job, _observe(job, looked), lease=lease)


