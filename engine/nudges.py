"""Which job moves nudge their run (process_run), and which save the message: the engine's rules,
called by the transition functions (runs/transitions.py) after each job move they write.

A nudge asks process_run to derive the run's status from its jobs. Most moves cannot change what it
derives, and a process_run for them is a task and a handful of statements per job for nothing; a
job ending without a failure matters only when it is the last of its run's current jobs to end.
A nudge this rule saves wrongly costs a late derive, never a lost one: the sweep re-derives any
run left unchanged (engine/sweeps.py, whose `_nudged` mirrors may_change_run).

Layer: the transition functions (tables) call this module, so it imports only tables and
messages, as they do (tests/test_import_graph.py names it in the tables layer).
"""

from __future__ import annotations

from functools import partial

from engine import messages
from runs import rows
from runs.choices import FAILING_REASONS, JOB_FINISHED, RUN_FINISHED, JobStatus, RunStatus
from runs.configuration.stored import StoredService, run_configuration
from runs.models import Job, Run
from serving.rows import notify_routes


def may_change_run(job: Job, to: str, reason: str) -> bool:
    """Whether a job entering `to` can change what process_run derives for its run.

    Most moves cannot (pulling; running, which move_job applies to the run itself; terminating
    because the runner finished or a stop is under way). A stale `job.run.status` only costs an
    extra nudge; the sweep re-derives any run left unchanged.
    """
    if to in JOB_FINISHED:
        return True
    if to == JobStatus.TERMINATING:
        return reason in FAILING_REASONS
    if to == JobStatus.PROVISIONING:
        return job.run.status == RunStatus.SUBMITTED
    return False


def ended_without_failure(status: str, reason: str) -> bool:
    return status in JOB_FINISHED and status != JobStatus.FAILED and reason not in FAILING_REASONS


def matters_only_last(job: Job, to: str, reason: str) -> bool:
    """Whether a job ending in `to` can change its run only if no other current job of the run is
    still unfinished: it ended without a failure, so process_run acts once all have ended (the run
    done, or its teardown over). Not so for the master of a `stop_criteria: master-done` run, nor
    while a group of the run restarts (its end starts the next pass while other groups run on); a
    stale `job.run` there only costs a nudge the sweep would send anyway
    (process_run's `_derive_again_if_moved` and the sweep's routine derive)."""
    if not ended_without_failure(to, reason):
        return False
    run = job.run
    if run.restarts or is_service(run):  # a service's replica ending is acted on at once (replaced, rolled on)
        return False
    return not (job.job_num == 0 and run_configuration(run).stop_criteria == "master-done")


def derive_due(run_id: int, run: Run | None = None) -> bool:
    """Whether every current job of the run has ended while the run itself has not: one short read,
    after its caller's commit. A run already finished needs no derive: process_run could not claim
    it (the jobs a teardown ends in the step that then finishes the run would each nudge for nothing).
    `run`: the caller's copy; one it saw finish (in the transaction that just committed) is not read."""
    if run is not None and run.status in RUN_FINISHED:
        return False
    return rows.derive_due(run_id)


def job_moved(job: Job, to: str, reason: str, ended_for: str) -> None:
    """The nudge a move of `job` to `to` sends its run, if any. `reason`: the termination reason the
    move writes ("" for none); `ended_for`: the reason the job ends with (the one it held before,
    when the move writes none)."""
    if not may_change_run(job, to, reason):
        return
    if matters_only_last(job, to, ended_for):
        messages.process_run_if(job.run_id, partial(derive_due, job.run_id, job.run))
    else:
        messages.process_run(job.run_id)


def jobs_moved(run: Run, jobs: list[Job], to: str, reason: str) -> None:
    """The one nudge the moves of `jobs` of `run` to `to` send together, if any (each would send
    the same one; the messages send a run's nudge once per transaction anyway)."""
    if not jobs or not may_change_run(jobs[0], to, reason):
        return
    if all(matters_only_last(j, to, reason) for j in jobs):
        messages.process_run_if(run.pk, partial(derive_due, run.pk, run))
    else:
        messages.process_run(run.pk)


def is_service(run: Run) -> bool:
    return isinstance(run_configuration(run), StoredService)


def routes_change(job: Job, to: str, fields: dict) -> bool:
    """Whether moving `job` to `to` writing `fields` may change its service's ready set (the
    endpoint's pool: running, not superseded, ready_at set; serving/replicas.py): its readiness set
    or cleared, a drain begun, or a ready replica leaving `running`. Never for a task's job."""
    if not is_service(job.run):
        return False
    if "ready_at" in fields or "drain_at" in fields:
        return True
    return job.ready_at is not None and job.status == JobStatus.RUNNING and to != JobStatus.RUNNING


def routes_moved(job: Job) -> None:
    """In the transaction of the move routes_change said yes to: the endpoints re-read the
    service's replicas once it commits, and the run is derived again (a rolling update waits for a
    new replica to be ready; a replica that stopped serving may need replacing)."""
    notify_routes(job.run_id)
    messages.process_run(job.run_id)
    if is_routed(job.run):
        messages.sync_routers(job.run_id)  # its routers' worker lists follow the ready set


def is_routed(run: Run) -> bool:
    """A service whose worker list Muster keeps in a router of its own (serving/router_sync.py)."""
    conf = run_configuration(run)
    return isinstance(conf, StoredService) and any(g.router == "smg" for g in conf.groups)


def run_routes_end(run: Run, to: str) -> bool:
    """Whether moving `run` to `to` takes its service out of the endpoint (it stops or ends)."""
    return to in (RunStatus.TERMINATING, *RUN_FINISHED) and is_service(run)


def routes_ended(run: Run) -> None:
    """In the transaction of the run's move run_routes_end said yes to."""
    notify_routes(run.pk)
