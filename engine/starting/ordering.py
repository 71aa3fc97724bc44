"""What a job waits for before it may start: `startup_order` and its group's `depends_on`.

A node that is waited on counts once it is *ready*: with probes, when its `ready_at` is set
(engine/running/readiness.py); without probes, when it started, exactly as before probes existed
(dstack's meaning of `startup_order`). A node that finished `done` counts as ready too: there is
nothing left to wait for, and a short master must not block its workers.
"""

from __future__ import annotations

from engine.job_outcome import learn
from runs.choices import JobStatus
from runs.configuration.readiness import CONDITION_DONE, Probe
from runs.configuration.stored import StoredGroup, StoredRun, run_configuration
from runs.models import Job


def group_conf(job: Job) -> StoredGroup:
    """The job's group as configured."""
    return run_configuration(job.run).group(job.node_group_index)


def probes_of(job: Job) -> tuple[Probe, ...]:
    """The group's probes; none on the other nodes of a service's multi-host replica, whose node 0
    alone serves (it is ready when its probes pass; the others once they run)."""
    if job.node_group_rank != 0 and run_configuration(job.run).type == "service":
        return ()
    return group_conf(job).probes


def has_ordering(conf: StoredRun) -> bool:
    """Whether any job of the run may wait for another one to start (or be ready, or done)."""
    return conf.startup_order != "any" or any(g.depends_on for g in conf.groups)


def started(job: Job) -> bool:
    return job.start_time is not None or job.status in (JobStatus.RUNNING, JobStatus.DONE)


def ready(job: Job) -> bool:
    if not probes_of(job):
        return started(job)
    return job.ready_at is not None or job.status == JobStatus.DONE


def waits_for(job: Job, jobs: list[Job]) -> str:
    """What `job` waits for before it may start, in words ("" when nothing)."""
    order = run_configuration(job.run).startup_order
    # jobs[0]: job 0 of a task, node 0 of a service's replica (its jobs only: cluster.replica_of)
    if order == "master-first" and job.pk != jobs[0].pk and not ready(jobs[0]):
        return f"the master (job {jobs[0].job_num}) to be " + ("ready" if probes_of(jobs[0]) else "running")
    if order == "workers-first" and job.pk == jobs[0].pk:
        behind = [j for j in jobs[1:] if not ready(j)]
        if behind:
            return f"the workers to be ready ({len(jobs) - 1 - len(behind)} of {len(jobs) - 1}; next: job {behind[0].job_num})"
    for dep in group_conf(job).depends_on:
        members = [j for j in jobs if j.node_group_name == dep.group]
        if dep.condition == CONDITION_DONE:
            behind = [j for j in members if j.status != JobStatus.DONE]
        else:
            behind = [j for j in members if not ready(j)]
        if behind:
            return (f"group {dep.group} to be {dep.condition or 'ready'} "
                    f"({len(members) - len(behind)} of {len(members)})")
    return ""


ADDRESSES = "the peers' addresses"


def note_wait(job: Job, waits: str) -> None:
    """Keep what the job waits for on its row (API, `muster ps -v`); a wait for another node is
    also an event. Written only when it changes (with the step's give-back): a job looked at every
    poll writes nothing new."""
    waits = waits[:200]
    if waits == job.waiting_for:
        return
    learn(job, event=f"waiting for {waits}" if waits and waits != ADDRESSES else "", waiting_for=waits)
