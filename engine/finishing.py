"""Ending jobs and runs: user stop/abort, teardown, and giving hosts back."""

from __future__ import annotations

import logging
from functools import partial

from django.db import DatabaseError, transaction
from django.utils import timezone

from backends.base import BackendError
from backends.registry import compute_for_instance
from engine import attach_revokes, claims, failure_policy, job_hosts, log_copy, messages, runner_status
from engine.running import watch
from engine.submitted import waiting
from engine.submitted.waiting import hand_back
from engine.tuning import GATHERED, STOP_RECHECK, STOP_RECHECK_SLOW
from events.services import record
from muster import compiled
from muster.claimable import Lease
from runs.choices import (
    FINAL_STATUS,
    JOB_ACTIVE,
    JOB_UNFINISHED,
    RUNNER_LIVE,
    JobReason,
    JobStatus,
)
from runs.models import Job, Run
from runs.stop_grace import gives_up_after
from runs.transitions import end_unstarted_jobs, move_job, terminate_job

log = logging.getLogger(__name__)


# the project for the log copy's quota (log_storage.quota_for), read with the job; compiled once
_JOB = compiled.Select(lambda pk: Job.objects.select_related(
    "run", "run__project", "instance", "instance__fleet").filter(pk=pk), int)


# a batch's jobs: the hosts' fleets are read once for the batch (engine/job_hosts.py), not joined
# to each job (an SSH fleet's row lists every host); not what the user wrote, which no finish reads
_BATCH_ROWS = Job.objects.select_related("run", "run__project", "instance").defer("run__submitted_text")


def finish_job(job_id: int) -> bool:
    """Task body for a terminating job: stop the runner's process, keep the log, free the host.
    True when the job ended in this call."""
    held = claims.claimed(Job, job_id, "finish_job", _finish, status=JobStatus.TERMINATING)
    return held is not None and job_id in held.applied and held.outcome.move is not None


def finish_jobs(job_ids: list[int]) -> set[int]:
    """finish_job for several terminating jobs in one claimed step (the ends one step saw together:
    a watch batch's, a run's teardown; engine/messages.py `gathered`): claimed, read and their
    attach grants marked together, their runners asked at once in threads, then each finished on
    its host as finish_job would as soon as its answer comes (a host that does not answer holds
    up no other job) and given back at once, in its own transaction (an error backs off that job
    alone). What their ends ask for goes once the step is over: their fleets' admission looks
    once (engine/submitted/waiting.py `releases_gathered`), their runs' derives a few messages at
    a time. Returns the ids that ended in this call."""
    due = Job.objects.filter(pk__in=job_ids, status=JobStatus.TERMINATING)
    ended: set[int] = set()
    with messages.gathered(GATHERED), waiting.releases_gathered():
        held = claims.claimed_batch(due, len(job_ids), "finish_jobs", partial(_finish_each, ended))
    return ended & held.applied


def _finish_each(ended: set[int], held: claims.Held) -> dict[int, claims.Outcome]:
    jobs = {j.pk: j for j in job_hosts.with_fleets(list(held.rows(_BATCH_ROWS)))}
    grants = attach_revokes.end_grants_of(sorted(jobs))
    hosts, unmade = _hosts(jobs.values())
    try:
        for pk in sorted(set(jobs) - set(hosts) - set(unmade)):  # no runner to ask
            _finish_now(held, jobs[pk], grants.get(pk, 0), None, ended)
        for pk in sorted(unmade):  # its host could not be made: as finish_job meets that error
            _finish_now(held, jobs[pk], grants.get(pk, 0), (None, None, unmade[pk]), ended)
        if len(hosts) < 2:  # one gains nothing from a thread: its step asks itself
            answers = [(pk, (None, None)) for pk in sorted(hosts)]
        else:  # each acted on as its answer comes: a host that does not answer holds up no other job
            answers = watch.as_answered({pk: partial(_status_of, host) for pk, host in hosts.items()})
        for pk, (status, error) in answers:
            _finish_now(held, jobs[pk], grants.get(pk, 0), (hosts.pop(pk), status, error), ended)
    finally:
        for host in hosts.values():  # rows the step did not reach (its time limit): their connections go
            host.close()
    return {}


def _finish_now(held: claims.Held, job: Job, grants: int, asked: tuple | None, ended: set[int]) -> None:
    with held.row(job.pk):
        outcome = _finish_one(job, grants, asked)
        if outcome.move is not None:
            ended.add(job.pk)
        held.give_back_now(job.pk, outcome)  # its host back now, not once the batch is done


def _hosts(jobs) -> tuple[dict, dict]:
    """The hosts whose runners the step asks, made on this thread as the watch makes them: ({job
    id: host}, {job id: the error that kept its host from being made}). Not for a job its step
    does not ask (never handed to a runner, or ended on a host that was already unreachable)."""
    hosts, unmade = {}, {}
    for job in sorted(jobs, key=lambda j: j.pk):
        if job.runner_submitted and job.instance is not None and not _gone(job):
            try:
                hosts[job.pk] = compute_for_instance(job.instance).runner_host(job.instance)
            except Exception as exc:  # noqa: BLE001 - raised again on the job's own row (_runner_finished)
                unmade[job.pk] = exc
    return hosts, unmade


def _status_of(host) -> tuple[dict | None, Exception | None]:
    try:
        return runner_status.read(host), None
    except Exception as exc:  # noqa: BLE001 - raised again on the job's own row (_runner_finished)
        return None, exc


def _gone(job: Job) -> bool:
    """The job ended because its host stopped answering and it still does not: nothing is asked."""
    return job.instance.unreachable and job.termination_reason == JobReason.INSTANCE_UNREACHABLE


def _finish(held: claims.Held) -> claims.Outcome:
    job = _JOB.get(held.pk)
    # whatever happens next (the host may never answer), the job's attach lines are due to go
    return _finish_one(job, attach_revokes.end_job_grants(job))


def _finish_one(job: Job, grants: int, asked: tuple | None = None) -> claims.Outcome:
    """The finish of one held job whose attach lines are marked due (`grants` of them); `asked`:
    its runner asked already (_ask_runners)."""
    final = FINAL_STATUS.get(job.termination_reason, JobStatus.TERMINATED)
    try:
        if job.runner_submitted and job.instance is not None and not _runner_finished(job, grants, asked):
            # still running on its host: look again soon, once the job is given back; a job still in its
            # grace (stop_duration, minutes) is looked at every few seconds, not four times a second
            waited = (timezone.now() - job.status_changed_at).total_seconds()
            again = STOP_RECHECK if waited < STOP_RECHECK_SLOW else STOP_RECHECK_SLOW
            return claims.Outcome(expect=(JobStatus.TERMINATING,),
                                  then=(partial(messages.finish_job, job.pk, countdown=again),))
    except BackendError as exc:
        log.info("job %s: runner unreachable while stopping (%s); handing its host back anyway", job, exc)
    return claims.Outcome(move=partial(_end, job, final))


def _end(job: Job, final: str, *, lease: Lease) -> bool:
    """The give-back is the final move: the host goes back and the job ends in one transaction."""
    keep = job.instance_id is not None and failure_policy.keeps_host(job)
    with transaction.atomic():
        if keep:
            record(job.run.project_id, f"instance {job.instance.name}", f"kept busy by job {job.run.name}/"
                   f"{job.job_num} for the restart of group {job.node_group_name}", status=job.instance.status,
                   run_id=job.run_id, job_id=job.pk, instance_id=job.instance_id)
        elif job.instance_id:
            hand_back([job.instance], job)
        if not move_job(job, final, frm=[JobStatus.TERMINATING], lease=lease, keep_host=keep):
            transaction.set_rollback(True)  # not ours any more: its holder hands the host back
            return False
    return True


def _runner_finished(job: Job, grants: int | None = None, asked: tuple | None = None) -> bool:
    """Stop the runner's job if it still runs; once it is over, copy its log and clean up.

    `grants`: how many attach grants _finish marked due (attach.revoke); `asked`: (the host, its
    runner's status, the error) when the runner was asked already (_ask_runners)."""
    host, status, error = asked or (compute_for_instance(job.instance).runner_host(job.instance), None, None)
    if host is None:
        raise error
    try:
        if _gone(job):
            return True
        if error is not None:
            raise error
        if status is None:
            status = runner_status.read(host)
        state = (status["jobs"].get(job.runner_job_id) or {}).get("state")
        if state in RUNNER_LIVE:
            waited = (timezone.now() - job.status_changed_at).total_seconds()
            if waited > gives_up_after(job.run):
                attach_revokes.revoke(job, host, grants)
                return True  # the host does not stop it; the host is handed back regardless
            host.stop(job.runner_job_id)
            return False
        attach_revokes.revoke(job, host, grants)  # before the log copy: the key must not outlive the job
        try:
            log_copy.keep_copy(job, host)
        except OSError as exc:
            # The server's disk (full, unwritable) must not hold the job and its host forever.
            log.warning("job %s: its log could not be kept: %s", job, exc)
            _say_log_lost(job, exc)
        finally:
            # The job directory holds its output (which may print secrets): it goes even when
            # the copy failed, rather than stay on the host for good.
            host.cleanup(job.runner_job_id)
        return True
    finally:
        host.close()


def _say_log_lost(job: Job, exc: OSError) -> None:
    # Otherwise the job's log just reads empty. On the embedded default the database shares the
    # full disk, so the event may not be written either: the warning above is then all there is.
    try:
        record(job.run.project_id, f"run {job.run.name}", f"the log of job {job.job_num} was not kept: "
               f"the server could not write it ({exc.strerror or exc})", status=job.status, run_id=job.run_id,
               job_id=job.pk)
    except DatabaseError as again:
        log.warning("job %s: could not record that its log was lost: %s", job, again)


def end_active_jobs(run: Run, reason: str, actor: str = "server", jobs: list[Job] | None = None) -> int:
    """Terminate every active job of the run's current submission; return how many are still active.

    `jobs`: the run's current jobs as its holder read them under the run's claim (each with `run`
    set), instead of a read of its own. Every move is guarded by the status it was read in, so a
    job that moved since does not move here: it is counted as still active, and the run waits for
    the derive its move asks for (a run is never finished past a job that just started)."""
    if jobs is None:
        jobs = list(run.current_jobs().select_related("run", "instance"))
    unfinished = [j for j in jobs if j.status in JOB_UNFINISHED]
    # never started anywhere: nothing to stop, ended together; a host a group batch reserved goes back
    for job in end_unstarted_jobs([j for j in unfinished if j.status == JobStatus.SUBMITTED], reason, actor=actor):
        if job.instance_id:
            hand_back([job.instance], job)
    for job in unfinished:
        if job.status in JOB_ACTIVE and job.status != JobStatus.SUBMITTED:
            terminate_job(job, reason, actor=actor)
    # a copy that did not move (it moved since it was read) still holds its status as read
    return sum(1 for j in unfinished if j.status in JOB_UNFINISHED)


def stop_jobs_on_group(group, actor: str = "api") -> None:
    for job in Job.objects.filter(instance__group=group, status__in=JOB_ACTIVE).select_related("run"):
        terminate_job(job, JobReason.TERMINATED_BY_SERVER, f"instance group {group.name} was deleted", actor=actor)
